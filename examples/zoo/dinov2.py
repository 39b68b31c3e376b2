"""`dinov2`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/dinov2.py -o dinov2.h5`
"""

from registry import builder

build = builder("dinov2")
