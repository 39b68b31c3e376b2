"""`gpt_neox`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/gpt_neox.py -o gpt_neox.h5`
"""

from registry import builder

build = builder("gpt_neox")
