"""tapml-dbg: record a model on a trusted source, replay it on a TVM target, find what diverges."""

# Importing the package changes nothing in the environment: the process entry points (tapml_dbg.entry)
# and the workers tapml-dbg starts set their own defaults (settings.PROCESS_DEFAULTS).

import importlib.util

__version__ = "0.1.0"
WEIGHT_FILES_ATTR = "tapml_weight_files"  # where `weights_from` leaves the files (record/weight_refs.py reads it)


def open(trace, target: str = "llvm", **options):
    """Open a trace for replay from Python: `with tapml_dbg.open("t.h5", target="llvm") as replay:`
    (`tapml_dbg.api.open`; docs/api.md). Imported here, not above, so that a worker process, which
    imports this package first, does not import the engine."""
    from tapml_dbg.api import open as open_trace

    return open_trace(trace, target, **options)


def __getattr__(name: str):
    """`tapml_dbg.diff(...)` and every other command of the table of commands (`tapml_dbg.api.COMMANDS`)
    that is a function of its own arguments, not a `Replay` method: the API's, imported when first asked
    for (as `open`). A submodule's name is left to the import system."""
    if name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from tapml_dbg.api import COMMANDS

    for entry in COMMANDS:
        if entry.function is not None and entry.function.__name__ == name and not entry.on_replay:
            return entry.function
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def weights_from(model, *paths):
    """Say that `model`'s weights were loaded from these safetensors files (e.g. with your own
    `model.load_state_dict(safetensors.torch.load_file(path))`), so that `tapml-dbg record` stores each
    param whose bytes a tensor of the same name in them holds as a reference to the file, not a copy
    (docs/trace-format.md "Weights by reference"); `from_pretrained` models need nothing. Returns `model`."""
    setattr(model, WEIGHT_FILES_ATTR, [*getattr(model, WEIGHT_FILES_ATTR, []), *paths])
    return model
