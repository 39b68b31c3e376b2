"""`phi3`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/phi3.py -o phi3.h5`
"""

from registry import builder

build = builder("phi3")
