"""`convbert`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/convbert.py -o convbert.h5`
"""

from registry import builder

build = builder("convbert")
