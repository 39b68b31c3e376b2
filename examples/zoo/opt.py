"""`opt`: decoder LLM from a small transformers config with random weights.

The config and the positional wrapper are in registry.py; `tapml-dbg record examples/zoo/opt.py -o t.h5`.
"""

from registry import builder

build = builder("opt")
