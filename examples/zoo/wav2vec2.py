"""`wav2vec2`: an audio encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/wav2vec2.py -o wav2vec2.h5`
"""

from registry import builder

build = builder("wav2vec2")
