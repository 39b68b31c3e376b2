"""`granite`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/granite.py -o granite.h5`
"""

from registry import builder

build = builder("granite")
