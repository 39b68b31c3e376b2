"""`t5`: encoder-decoder (one forward with decoder_input_ids) from a small transformers config with random weights.

The config and the positional wrapper are in registry.py; `tapml-dbg record examples/zoo/t5.py -o t.h5`.
"""

from registry import builder

build = builder("t5")
