"""`electra`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/electra.py -o electra.h5`
"""

from registry import builder

build = builder("electra")
