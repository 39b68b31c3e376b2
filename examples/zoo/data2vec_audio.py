"""`data2vec_audio`: audio encoder from a small transformers config with random weights.

The config and the positional wrapper are in registry.py; `tapml-dbg record examples/zoo/data2vec_audio.py -o t.h5`.
"""

from registry import builder

build = builder("data2vec_audio")
