"""`swin`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/swin.py -o swin.h5`
"""

from registry import builder

build = builder("swin")
