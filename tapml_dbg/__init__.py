"""tapml-dbg: record a model on a trusted source, replay it on a TVM target, find what diverges."""

# Importing the package changes nothing in the environment: the process entry points (tapml_dbg.entry)
# and the workers tapml-dbg starts set their own defaults (settings.PROCESS_DEFAULTS).

__version__ = "0.1.0"
WEIGHT_FILES_ATTR = "tapml_weight_files"  # where `weights_from` leaves the files (record/weight_refs.py reads it)


def open(trace, target: str = "llvm", **options):
    """Open a trace for replay from Python: `with tapml_dbg.open("t.h5", target="llvm") as replay:`
    (`tapml_dbg.api.open`; docs/api.md). Imported here, not above, so that a worker process, which
    imports this package first, does not import the engine."""
    from tapml_dbg.api import open as open_trace

    return open_trace(trace, target, **options)


def diff(a, b, **options):
    """Two recordings of one model compared op by op and layer by layer, B against A:
    `tapml_dbg.diff("fp32.h5", "bf16.h5").to_json()` (`tapml_dbg.api.diff`; docs/diff.md). No target, no replay."""
    from tapml_dbg.api import diff as diff_traces

    return diff_traces(a, b, **options)


def weights_from(model, *paths):
    """Say that `model`'s weights were loaded from these safetensors files (e.g. with your own
    `model.load_state_dict(safetensors.torch.load_file(path))`), so that `tapml-dbg record` stores each
    param whose bytes a tensor of the same name in them holds as a reference to the file, not a copy
    (docs/trace-format.md "Weights by reference"); `from_pretrained` models need nothing. Returns `model`."""
    setattr(model, WEIGHT_FILES_ATTR, [*getattr(model, WEIGHT_FILES_ATTR, []), *paths])
    return model
