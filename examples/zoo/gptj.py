"""`gptj`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/gptj.py -o gptj.h5`
"""

from registry import builder

build = builder("gptj")
