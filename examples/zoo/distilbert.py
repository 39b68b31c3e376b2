"""`distilbert`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/distilbert.py -o distilbert.h5`
"""

from registry import builder

build = builder("distilbert")
