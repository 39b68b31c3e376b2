"""`levit`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/levit.py -o levit.h5`
"""

from registry import builder

build = builder("levit")
