"""`gpt2_124m`: decoder LLM from a small transformers config with random weights (the real GPT-2 small config (124M params), seq 64).

The config and the positional wrapper are in registry.py; `tapml-dbg record examples/zoo/gpt2_124m.py -o t.h5`.
"""

from registry import builder

build = builder("gpt2_124m")
