"""`xglm`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/xglm.py -o xglm.h5`
"""

from registry import builder

build = builder("xglm")
