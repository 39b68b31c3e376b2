"""`stablelm`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/stablelm.py -o stablelm.h5`
"""

from registry import builder

build = builder("stablelm")
