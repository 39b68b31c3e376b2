"""`gpt_neo`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/gpt_neo.py -o gpt_neo.h5`
"""

from registry import builder

build = builder("gpt_neo")
