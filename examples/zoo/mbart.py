"""`mbart`: an encoder-decoder (one forward with decoder_input_ids), tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/mbart.py -o mbart.h5`
"""

from registry import builder

build = builder("mbart")
