"""A small MLP with submodules: the quickest model to record and replay."""

import torch


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.norm(x)))


class MLP(torch.nn.Module):
    def __init__(self, width: int = 32, depth: int = 3, classes: int = 10):
        super().__init__()
        self.proj = torch.nn.Linear(16, width)
        self.blocks = torch.nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x):
        return torch.softmax(self.head(self.blocks(self.proj(x))), dim=-1)


def build():
    return MLP().eval(), (torch.randn(4, 16),)
