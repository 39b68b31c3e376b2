"""`mobilebert`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/mobilebert.py -o mobilebert.h5`
"""

from registry import builder

build = builder("mobilebert")
