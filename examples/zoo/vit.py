"""`vit`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/vit.py -o vit.h5`
"""

from registry import builder

build = builder("vit")
