"""`deberta_v2`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/deberta_v2.py -o deberta_v2.h5`
"""

from registry import builder

build = builder("deberta_v2")
