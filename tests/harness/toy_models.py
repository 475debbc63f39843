"""Tiny user models for the compare harness tests: ``tests.harness.toy_models:NAME``."""

import os
import time

import torch


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.lin(x))


class _Breaks(_Linear):
    def forward(self, x):
        y = self.lin(x)
        print("vspyre-toy: a print in forward")     # a Dynamo graph break
        return torch.relu(y)


class _Median(_Linear):
    def forward(self, x):
        return torch.median(self.lin(x), dim=-1).values   # no tile form on spyre: a host fallback


class _Hangs(_Linear):
    def forward(self, x):
        time.sleep(3600)
        return x


def _inputs(batch=2, seq=4):
    return torch.randn(batch, seq, 16, generator=torch.Generator().manual_seed(0))


def simple(batch=2, seq=4):
    torch.manual_seed(0)
    return _Linear(), _inputs(batch, seq)


def graph_break(batch=2, seq=4):
    torch.manual_seed(0)
    return _Breaks(), _inputs(batch, seq)


def host_fallback(batch=2, seq=4):
    torch.manual_seed(0)
    return _Median(), _inputs(batch, seq)


def crash():
    os.abort()


def hang():
    torch.manual_seed(0)
    return _Hangs(), _inputs()
