"""`opt`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/opt.py -o opt.h5`
"""

from registry import builder

build = builder("opt")
