"""`resnet`: a CNN, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/resnet.py -o resnet.h5`
"""

from registry import builder

build = builder("resnet")
