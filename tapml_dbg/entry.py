"""The process entry point: `tapml-dbg` (pyproject's console script) and `python -m tapml_dbg`.

It sets the process's defaults (`settings.PROCESS_DEFAULTS`: one OpenBLAS thread unless the user
chose) before anything imports numpy, then runs the CLI; a library import of the package sets
nothing. The CLI is imported here, inside `main`, for that reason (the one such import).
"""

from __future__ import annotations

from tapml_dbg import settings


def main(argv: list[str] | None = None) -> int:
    settings.apply_process_defaults()
    from tapml_dbg.ui.cli import main as cli_main  # after the defaults: it imports numpy

    return cli_main(argv)
