"""A float64 linear layer: TVM 0.27's stock import declares its matmul float32 (docs/triage.md)."""

import torch


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.tanh(self.fc(x)) - 0.5


def build():
    torch.manual_seed(0)
    return Head().double().eval(), (torch.randn(3, 8, dtype=torch.float64),)
