"""`roberta`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/roberta.py -o roberta.h5`
"""

from registry import builder

build = builder("roberta")
