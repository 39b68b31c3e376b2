"""`mobilenet_v2`: a CNN, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/mobilenet_v2.py -o mobilenet_v2.h5`
"""

from registry import builder

build = builder("mobilenet_v2")
