"""`wavlm`: an audio encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/wavlm.py -o wavlm.h5`
"""

from registry import builder

build = builder("wavlm")
