"""`xlm_roberta`: a text encoder, tiny config, random weights (defined in registry.py).

`tapml-dbg record examples/zoo/xlm_roberta.py -o xlm_roberta.h5`
"""

from registry import builder

build = builder("xlm_roberta")
