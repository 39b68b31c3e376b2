"""`convnext`: a CNN, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/convnext.py -o convnext.h5`
"""

from registry import builder

build = builder("convnext")
