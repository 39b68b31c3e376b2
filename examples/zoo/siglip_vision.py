"""`siglip_vision`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/siglip_vision.py -o siglip_vision.h5`
"""

from registry import builder

build = builder("siglip_vision")
