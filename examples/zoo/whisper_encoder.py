"""`whisper_encoder`: an audio encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/whisper_encoder.py -o whisper_encoder.h5`
"""

from registry import builder

build = builder("whisper_encoder")
