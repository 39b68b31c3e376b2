"""`convnextv2`: a CNN, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/convnextv2.py -o convnextv2.h5`
"""

from registry import builder

build = builder("convnextv2")
