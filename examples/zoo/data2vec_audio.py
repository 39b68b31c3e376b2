"""`data2vec_audio`: an audio encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/data2vec_audio.py -o data2vec_audio.h5`
"""

from registry import builder

build = builder("data2vec_audio")
