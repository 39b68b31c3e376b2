"""`segformer`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/segformer.py -o segformer.h5`
"""

from registry import builder

build = builder("segformer")
