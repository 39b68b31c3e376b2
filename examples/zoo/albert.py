"""`albert`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/albert.py -o albert.h5`
"""

from registry import builder

build = builder("albert")
