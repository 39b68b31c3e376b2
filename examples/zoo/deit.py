"""`deit`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/deit.py -o deit.h5`
"""

from registry import builder

build = builder("deit")
