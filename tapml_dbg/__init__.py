"""tapml-dbg: record a model on a trusted source, replay it on a TVM target, find what diverges."""

# Importing the package changes nothing in the environment: the process entry points (tapml_dbg.entry)
# and the workers tapml-dbg starts set their own defaults (settings.PROCESS_DEFAULTS).

__version__ = "0.1.0"


def open(trace, target: str = "llvm", **options):
    """Open a trace for replay from Python: `with tapml_dbg.open("t.h5", target="llvm") as replay:`
    (`tapml_dbg.api.open`; docs/api.md). Imported here, not above, so that a worker process, which
    imports this package first, does not import the engine."""
    from tapml_dbg.api import open as open_trace

    return open_trace(trace, target, **options)
