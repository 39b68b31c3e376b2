"""`ernie`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/ernie.py -o ernie.h5`
"""

from registry import builder

build = builder("ernie")
