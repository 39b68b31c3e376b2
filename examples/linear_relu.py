"""One linear layer and a ReLU: the smallest model with a matmul (docs/remote.md: metal's matmul crash)."""

import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval(), (torch.randn(2, 4),)
