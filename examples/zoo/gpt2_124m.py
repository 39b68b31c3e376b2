"""`gpt2_124m`: a decoder LLM, real-size config, random weights (defined in registry.py).

The real GPT-2 small config (124M params), seq 64.

`tapml-dbg record examples/zoo/gpt2_124m.py -o gpt2_124m.h5`
"""

from registry import builder

build = builder("gpt2_124m")
