"""`python -m tapml_dbg ...` is `tapml-dbg ...`."""

import sys

from tapml_dbg.ui.cli import main

sys.exit(main())
