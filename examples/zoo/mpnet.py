"""`mpnet`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/mpnet.py -o mpnet.h5`
"""

from registry import builder

build = builder("mpnet")
