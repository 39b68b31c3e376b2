"""fp16 cross-attention over a long memory (4096 slots), between two projections.

A real TVM 0.27 divergence: on llvm the legalized fp16 softmax accumulates its row sum in
fp16, so rows this long normalize wrongly (the rows of the result no longer sum to 1).
`tapml-dbg bisect` points at the softmax in the middle of the model.
"""

import torch


class MemoryAttention(torch.nn.Module):
    def __init__(self, width: int = 64, slots: int = 4096):
        super().__init__()
        self.query = torch.nn.Linear(width, width)
        self.keys = torch.nn.Parameter(torch.randn(slots, width) * 0.5)
        self.values = torch.nn.Parameter(torch.randn(slots, width))
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        q = self.query(x)
        weights = torch.softmax(q @ self.keys.t(), dim=-1)
        return self.out(weights @ self.values)


def build():
    return MemoryAttention().half().eval(), (torch.randn(1, 8, 64).half(),)
