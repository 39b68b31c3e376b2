"""`cohere`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/cohere.py -o cohere.h5`
"""

from registry import builder

build = builder("cohere")
