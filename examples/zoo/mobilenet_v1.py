"""`mobilenet_v1`: a CNN, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/mobilenet_v1.py -o mobilenet_v1.h5`
"""

from registry import builder

build = builder("mobilenet_v1")
