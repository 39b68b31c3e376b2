"""An fp16 x-vector style speaker embedder: frame layers, statistics pooling, embedding.

A real TVM 0.27 divergence: statistics pooling takes the variance over 4096 frames; on llvm
the fp16 reduction accumulates in fp16 and loses ~8% of the variance. `tapml-dbg bisect`
points at the variance in the middle of the model.
"""

import torch


class StatsPoolEmbedder(torch.nn.Module):
    def __init__(self, features: int = 24, width: int = 32, embedding: int = 16):
        super().__init__()
        self.frames = torch.nn.Sequential(torch.nn.Linear(features, width), torch.nn.ReLU(),
                                          torch.nn.Linear(width, width))
        self.embed = torch.nn.Linear(2 * width, embedding)

    def forward(self, x):
        h = self.frames(x)  # (batch, frames, width)
        mean = h.mean(dim=1)
        std = torch.sqrt(h.var(dim=1) + 1e-5)
        return self.embed(torch.cat([mean, std], dim=-1))


def build():
    return StatsPoolEmbedder().half().eval(), (torch.randn(2, 4096, 24).half(),)
