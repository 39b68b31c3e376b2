"""`qwen3`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/qwen3.py -o qwen3.h5`
"""

from registry import builder

build = builder("qwen3")
