"""`mobilevit`: a vision transformer, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/mobilevit.py -o mobilevit.h5`
"""

from registry import builder

build = builder("mobilevit")
