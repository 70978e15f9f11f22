"""filter-9's dead_compute probe (filter._no_dead_module) on small models, CPU: what it must reject
and the valid tasks it must keep (review, thirty-eighth session)."""
import sys
import unittest
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from opforge import filter as flt  # noqa: E402
from opforge import task as T  # noqa: E402


def verdict(model, *inputs):
    model = model.eval()
    with torch.no_grad():
        outs = T.flatten_outputs(model(*[x.clone() for x in inputs]))
    try:
        flt._no_dead_module(model, list(inputs), outs, 1e-2, 1e-2)
        return "kept"
    except flt.Reject as e:
        return e.reason


class Gated(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.proj, self.fc = nn.Linear(64, 64), nn.Linear(64, 64)
        self.alpha = nn.Parameter(torch.full((1,), alpha))

    def forward(self, x):
        return self.proj(x) + torch.tanh(self.alpha) * self.fc(x)


class PooledConv(nn.Module):
    """Conv then a global average pool: elementwise noise averages out in the pool, yet the judge
    checks such an output on stressed inputs, where a skipped conv fails."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3)

    def forward(self, x):
        return F.adaptive_avg_pool2d(self.conv(x), 1)


class InPlace(nn.Module):
    """A module that scales its input in place; the caller keeps the input, not what it returns."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.scale = Scale(32)

    def forward(self, x):
        h = self.lin(x)
        self.scale(h)
        return h


class Scale(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x):
        return x.mul_(self.w)


class Scripted(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.jit.script(nn.Linear(16, 16))

    def forward(self, x):
        return self.lin(x)


class DeadCompute(unittest.TestCase):
    def test_a_branch_the_initial_weights_silence_is_rejected(self):
        torch.manual_seed(0)
        x = torch.randn(128, 64)
        self.assertEqual(verdict(Gated(0.0), x), "dead_compute")
        self.assertEqual(verdict(Gated(0.5), x), "kept")

    def test_valid_tasks_are_kept(self):
        torch.manual_seed(0)
        self.assertEqual(verdict(PooledConv(), torch.randn(8, 8, 256, 256)), "kept")  # dead on x, not on x*4+1
        self.assertEqual(verdict(InPlace(), torch.randn(16, 32)), "kept")
        self.assertEqual(verdict(Scripted(), torch.randn(16, 16)), "kept")  # no hook there: not probed
        m = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4))
        self.assertEqual(verdict(m, torch.randn(32, 16)), "kept")  # LayerNorm's zero bias gates nothing
        p = m[0].weight.detach().clone()
        verdict(m, torch.randn(32, 16))
        self.assertTrue(torch.equal(m[0].weight, p), "the probe's noise never lands in the weights")


if __name__ == "__main__":
    unittest.main()
