"""`regnet`: a CNN, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/regnet.py -o regnet.h5`
"""

from registry import builder

build = builder("regnet")
