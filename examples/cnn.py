"""A small CNN (conv, batch norm, pooling, linear head)."""

import torch


class ConvBlock(torch.nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)


class CNN(torch.nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = torch.nn.Sequential(ConvBlock(3, 8), ConvBlock(8, 16))
        self.head = torch.nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def build():
    model = CNN().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics, as in a trained model
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)
    return model, (torch.randn(2, 3, 16, 16),)
