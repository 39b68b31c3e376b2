"""`olmo`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/olmo.py -o olmo.h5`
"""

from registry import builder

build = builder("olmo")
