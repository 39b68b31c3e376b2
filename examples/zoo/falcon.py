"""`falcon`: a decoder LLM, tiny config, random weights (defined in registry.py).

Multi_query=False: see falcon_mqa.

`tapml-dbg record examples/zoo/falcon.py -o falcon.h5`
"""

from registry import builder

build = builder("falcon")
