"""`deberta`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/deberta.py -o deberta.h5`
"""

from registry import builder

build = builder("deberta")
