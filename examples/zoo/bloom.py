"""`bloom`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/bloom.py -o bloom.h5`
"""

from registry import builder

build = builder("bloom")
