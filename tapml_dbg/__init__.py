"""tapml-dbg: record a model on a trusted source, replay it on a TVM target, find what diverges."""

import os

# numpy's OpenBLAS starts a thread per core, and after each call its threads spin for work: the
# session's and each worker's small dot products then burned 16 threads x 0.6 s of CPU per bisect
# on the 16-core H200 host, beside the compile lanes. One thread (unless the user chose): it
# reads this when numpy is first imported, so here, before any module imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"


def open(trace, target: str = "llvm", **options):
    """Open a trace for replay from Python: `with tapml_dbg.open("t.h5", target="llvm") as replay:`
    (`tapml_dbg.api.open`; docs/api.md). Imported here, not above, so that a worker process, which
    imports this package first, does not import the engine."""
    from tapml_dbg.api import open as open_trace

    return open_trace(trace, target, **options)
