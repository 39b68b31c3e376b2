"""`persimmon`: a decoder LLM, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/persimmon.py -o persimmon.h5`
"""

from registry import builder

build = builder("persimmon")
