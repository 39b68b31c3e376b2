"""`t5`: an encoder-decoder (one forward with decoder_input_ids), tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/t5.py -o t5.h5`
"""

from registry import builder

build = builder("t5")
