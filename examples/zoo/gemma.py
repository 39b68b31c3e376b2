"""`gemma`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/gemma.py -o gemma.h5`
"""

from registry import builder

build = builder("gemma")
