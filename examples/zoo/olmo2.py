"""`olmo2`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/olmo2.py -o olmo2.h5`
"""

from registry import builder

build = builder("olmo2")
