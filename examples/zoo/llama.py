"""`llama`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/llama.py -o llama.h5`
"""

from registry import builder

build = builder("llama")
