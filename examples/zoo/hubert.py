"""`hubert`: an audio encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/hubert.py -o hubert.h5`
"""

from registry import builder

build = builder("hubert")
