"""`starcoder2`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/starcoder2.py -o starcoder2.h5`
"""

from registry import builder

build = builder("starcoder2")
