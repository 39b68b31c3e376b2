"""`bert`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/bert.py -o bert.h5`
"""

from registry import builder

build = builder("bert")
