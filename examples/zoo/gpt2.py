"""`gpt2`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/gpt2.py -o gpt2.h5`
"""

from registry import builder

build = builder("gpt2")
