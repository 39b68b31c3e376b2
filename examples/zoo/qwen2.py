"""`qwen2`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/qwen2.py -o qwen2.h5`
"""

from registry import builder

build = builder("qwen2")
