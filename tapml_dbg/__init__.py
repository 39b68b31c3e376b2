"""tapml-dbg: record a model on a trusted source, replay it on a TVM target, find what diverges."""

import os

# numpy's OpenBLAS starts a thread per core, and after each call its threads spin for work: the
# session's and each worker's small dot products then burned 16 threads x 0.6 s of CPU per bisect
# on the 16-core H200 host, beside the compile lanes. One thread (unless the user chose): it
# reads this when numpy is first imported, so here, before any module imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
