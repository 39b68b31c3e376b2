"""`falcon_mqa`: a decoder LLM, tiny config, random weights (defined in registry.py).

The Falcon-7B multi-query layout: a documented TVM 0.27 divergence.

`tapml-dbg record examples/zoo/falcon_mqa.py -o falcon_mqa.h5`
"""

from registry import builder

build = builder("falcon_mqa")
