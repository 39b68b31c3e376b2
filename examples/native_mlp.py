"""A model written in TVM itself (relax.frontend.nn, MLC-LLM's way): two pre-norm SwiGLU-free MLP blocks
and a softmax head. `build_tvm()` returns the exported Relax module and its arguments (the input, then
the parameters in export_tvm's order, named so that each op gets its layer).

    tapml-dbg record examples/native_mlp.py -o traces/native.h5 --source tvm:llvm
    tapml-dbg bisect traces/native.h5
"""

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

HIDDEN, ROWS, CLASSES = 32, 8, 10


class Block(nn.Module):
    def __init__(self, hidden: int):
        self.norm = nn.RMSNorm(hidden, axes=-1, bias=False)
        self.up = nn.Linear(hidden, 2 * hidden, bias=False)
        self.down = nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, x):
        return x + self.down(op.silu(self.up(self.norm(x))))


class NativeMLP(nn.Module):
    def __init__(self, hidden: int = HIDDEN, classes: int = CLASSES, blocks: int = 2):
        self.blocks = nn.ModuleList([Block(hidden) for _ in range(blocks)])
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return op.softmax(self.head(x), axis=-1)


def build_tvm(seed: int = 0):
    mod, params = NativeMLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor((ROWS, HIDDEN), "float32")}})
    rng = np.random.default_rng(seed)
    args = [("x", rng.standard_normal((ROWS, HIDDEN)).astype("float32"))]
    for name, param in params:
        scale = 1.0 if name.endswith("norm.weight") else 1.0 / np.sqrt(param.shape[-1])
        args.append((name, (rng.standard_normal(param.shape) * scale).astype(param.dtype)))
    return mod, args
