"""The process entry point: `tapml-dbg` (pyproject's console script) and `python -m tapml_dbg`.

It sets the process's defaults (`settings.PROCESS_DEFAULTS`: one OpenBLAS thread unless the user
chose) before anything imports numpy, hands the command to a running `tapml-dbg serve` when there is
one (runtime/fork_server.py: a fork with TVM and torch imported), or runs the CLI and then starts a
server for the next commands (`fork_server.start_for_next_commands`), and leaves without the
interpreter's teardown (`command`); a library import of the package sets nothing. The CLI is imported
here, inside `main`, for that reason; `serve_main` (the fork server's process) imports what its zygote
and command sides import inside functions too, each on its side of a fork.
"""

from __future__ import annotations

import os
import sys

from tapml_dbg import settings
from tapml_dbg.runtime import fork_server  # the standard library only: a client costs milliseconds


def main(argv: list[str] | None = None) -> int:
    settings.apply_process_defaults()
    from_command_line = argv is None  # this process's own command line: a running `tapml-dbg serve` may run it
    if from_command_line:
        folder = fork_server.server_folder(settings.value(settings.CACHE_DIR))
        served = fork_server.run_served(sys.argv[1:], folder)
        if served is not None:
            return served
        environment = dict(os.environ)  # the command's, as it started: a server started after it serves that
    from tapml_dbg.runtime.tvm_import import cheap_stack_inspection

    cheap_stack_inspection()  # TVMScript parsed in this process (a native model's kernels) parses faster
    from tapml_dbg.ui.cli import main as cli_main  # after the defaults: it imports numpy

    code = cli_main(argv)
    if from_command_line and fork_server.start_for_next_commands(sys.argv[1:], folder, environment) \
            and sys.stderr.isatty():
        sys.stderr.write(fork_server.STARTED_LINE.format(minutes=f"{fork_server.DEFAULT_IDLE_S / 60:g}") + "\n")
    return code


def command() -> None:
    """The `tapml-dbg` command (pyproject's console script, `python -m tapml_dbg`): `main`, then the
    process leaves without the interpreter's teardown (`fork_server.leave`), which takes a fresh
    process tenths of a second after its answer."""
    fork_server.leave(main())


def serve_main() -> None:
    """The process `tapml-dbg serve` starts (`fork_server.server_command`): the fork server, with what a
    zygote imports on one side and what a command imports on the other."""
    fork_server.main(sys.argv[1:], dict(settings.PROCESS_DEFAULTS), _zygote_imports, command_imports)


def _zygote_imports() -> None:
    from tapml_dbg.runtime.tvm_import import import_tvm_without_torch

    import_tvm_without_torch()  # as a zygote imports it
    import tapml_dbg.runtime.zygote  # noqa: F401 - and what its workers import


def command_imports() -> None:
    """What a `tapml-dbg` command imports before it reads anything: the fork server's command side imports
    it once for all its commands, and the test suite's processes before they freeze it."""
    import importlib.util

    import torch  # noqa: F401

    from tapml_dbg.runtime.tvm_import import cheap_stack_inspection

    cheap_stack_inspection()

    if importlib.util.find_spec("transformers") is not None:  # where installed: a record of one of its models
        import transformers.modeling_utils  # noqa: F401 - a served record of tiny GPT-2: 1.7 s, not 4.1
    import tapml_dbg.engine.session  # noqa: F401 - torch.export, h5py, ml_dtypes...
    import tapml_dbg.ui.cli  # noqa: F401 - rich, prompt_toolkit
