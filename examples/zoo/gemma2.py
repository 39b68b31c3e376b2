"""`gemma2`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/gemma2.py -o gemma2.h5`
"""

from registry import builder

build = builder("gemma2")
