"""The process entry point: `tapml-dbg` (pyproject's console script) and `python -m tapml_dbg`.

It sets the process's defaults (`settings.PROCESS_DEFAULTS`: one OpenBLAS thread unless the user
chose) before anything imports numpy, hands the command to a running `tapml-dbg serve` when there is
one (runtime/fork_server.py: a fork with TVM and torch imported), or runs the CLI; a library import of the package sets
nothing. The CLI is imported here, inside `main`, for that reason (the one such import).
"""

from __future__ import annotations

import sys

from tapml_dbg import settings


def main(argv: list[str] | None = None) -> int:
    settings.apply_process_defaults()
    if argv is None:  # this process's own command line: a running `tapml-dbg serve` may run it
        from tapml_dbg.runtime.fork_server import run_served, server_folder

        served = run_served(sys.argv[1:], server_folder(settings.value(settings.CACHE_DIR)))
        if served is not None:
            return served
    from tapml_dbg.ui.cli import main as cli_main  # after the defaults: it imports numpy

    return cli_main(argv)
