"""`beit`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/beit.py -o beit.h5`
"""

from registry import builder

build = builder("beit")
