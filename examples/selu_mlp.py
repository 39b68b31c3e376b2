"""A small MLP with a SELU: TVM 0.27's SELU is wrong on every target (its scale), a TVM-wide divergence."""

import torch


class SeluMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.act = torch.nn.SELU()
        self.fc2 = torch.nn.Linear(32, 16)
        self.out = torch.nn.Linear(16, 8)

    def forward(self, x):
        h = self.fc2(self.act(self.fc1(x)))
        return torch.softmax(self.out(torch.tanh(h)), dim=-1)


def build():
    torch.manual_seed(0)
    return SeluMLP(), (torch.randn(4, 16),)
