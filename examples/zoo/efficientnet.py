"""`efficientnet`: a CNN, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/efficientnet.py -o efficientnet.h5`
"""

from registry import builder

build = builder("efficientnet")
