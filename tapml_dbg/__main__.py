"""`python -m tapml_dbg ...` is `tapml-dbg ...`."""

from tapml_dbg.entry import command

command()
