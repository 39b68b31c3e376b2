"""`python -m tapml_dbg ...` is `tapml-dbg ...`."""

import sys

from tapml_dbg.entry import main

sys.exit(main())
