"""An fp16 MLP with a 16384-wide hidden layer: TVM 0.27's llvm matmul sums fp16 in fp16.

The down projection's matmul (the helper inside `addmm_1`) sums 16384 products; torch sums
them in fp32 and rounds once, TVM's default llvm lowering rounds to fp16 at every step (~3% off
here). `tapml-dbg bisect` names `addmm_1_p0`, the matmul, not the bias add after it.
"""

import torch


class WideProjection(torch.nn.Module):
    def __init__(self, width: int = 64, hidden: int = 16384):
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(hidden, width)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, 8)

    def forward(self, x):
        return self.head(self.norm(self.down(self.act(self.up(x)))))


def build():
    model = WideProjection().half().eval()
    return model, (torch.randn(16, 64).half(),)
