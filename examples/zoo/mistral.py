"""`mistral`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/mistral.py -o mistral.h5`
"""

from registry import builder

build = builder("mistral")
