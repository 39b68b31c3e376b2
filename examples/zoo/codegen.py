"""`codegen`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/codegen.py -o codegen.h5`
"""

from registry import builder

build = builder("codegen")
