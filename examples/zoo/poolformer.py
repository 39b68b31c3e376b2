"""`poolformer`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/poolformer.py -o poolformer.h5`
"""

from registry import builder

build = builder("poolformer")
