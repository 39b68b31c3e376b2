"""`deberta_v2`: text encoder from a small transformers config with random weights.

The config and the positional wrapper are in registry.py; `tapml-dbg record examples/zoo/deberta_v2.py -o t.h5`.
"""

from registry import builder

build = builder("deberta_v2")
