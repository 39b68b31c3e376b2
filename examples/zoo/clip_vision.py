"""`clip_vision`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/clip_vision.py -o clip_vision.h5`
"""

from registry import builder

build = builder("clip_vision")
