"""`phi`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/phi.py -o phi.h5`
"""

from registry import builder

build = builder("phi")
