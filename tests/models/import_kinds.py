"""Tiny models of the kinds TVM 0.27's own importer takes (or refuses), one build function each.

Each `build_*` returns `(module, inputs)` like an example's `build`; `tapml-dbg record
tests/models/import_kinds.py:build_cond` records one.
"""

import torch


class NoneOutput(torch.nn.Module):
    """forward returns None among its outputs."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x), None


class MaskedSelect(torch.nn.Module):
    """A data-dependent size (torch.export's unbacked u0)."""

    def forward(self, x):
        return torch.masked_select(x, x > 0).sum() + x.sum()


class OneHot(torch.nn.Module):
    """TVM imports one_hot with two runtime checks (R.assert_op) of the class values."""

    def forward(self, x):
        return torch.nn.functional.one_hot(x, 10).float() * 2.0


class Cond(torch.nn.Module):
    """torch.cond control flow."""

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda y: y * 2, lambda y: y - 1, (x,))


class SparseWeight(torch.nn.Module):
    """A sparse (COO) parameter: TVM imports it undecomposed and binds it dense."""

    def __init__(self):
        super().__init__()
        dense = torch.randn(8, 8) * (torch.rand(8, 8) > 0.7)
        self.w = torch.nn.Parameter(dense.to_sparse(), requires_grad=False)

    def forward(self, x):
        return torch.sparse.mm(self.w, x) + 1


class ToSparse(torch.nn.Module):
    """A sparse tensor made inside forward: TVM 0.27 has no converter for aten._to_sparse."""

    def forward(self, x):
        return torch.sparse.mm(x.to_sparse(), torch.ones(8, 4)) + 1


def build_none_output():
    return NoneOutput(), (torch.randn(2, 8),)


def build_masked_select():
    return MaskedSelect(), (torch.randn(4, 8),)


def build_one_hot():
    return OneHot(), (torch.randint(0, 10, (6,)),)


def build_cond():
    return Cond(), (torch.randn(4, 8) - 1.0,)  # sum < 0: the false branch


def build_sparse_weight():
    return SparseWeight(), (torch.randn(8, 4),)


def build_to_sparse():
    return ToSparse(), (torch.randn(4, 8),)
