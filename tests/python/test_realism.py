"""Unit tests of opforge.realism (the granularity of the realism figures) and of the graph
composer's grammar (python/opforge/compose_graph.py): its op domains and real-model layouts.

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import json
import os
import random
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

from opforge import compose_graph as CG  # noqa: E402
from opforge import realism as R  # noqa: E402

STATS = os.path.join(REPO, "data", "real_models", "stats.json")

TASK = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4096, 4096)
        self.act = nn.ReLU()

    def forward(self, x):
        x = self.fc(x)
        x = self.act(x)
        x = x.view(x.shape[0], -1).contiguous()
        x = torch.relu(x)
        x = F.relu(x)
        x = x.relu_()
        return x.sum(dim=1)

def get_inputs():
    return [torch.randn(65536, 4096)]

def get_init_inputs():
    return []
'''


class Canonical(unittest.TestCase):
    def test_aliases_and_in_place_forms_are_one_op(self):
        for name in ("F.relu", "torch.relu", "Tensor.relu", "Tensor.relu_", "torch.relu_"):
            self.assertEqual(R.canonical(name), "relu", name)
        self.assertEqual(R.canonical("torch.multiply"), "mul")
        self.assertEqual(R.canonical("Tensor.__iadd__"), "add")
        self.assertEqual(R.canonical("torch.special.expit"), "sigmoid")

    def test_views_metadata_creation_and_dropout_are_not_ops(self):
        for name in ("Tensor.view", "torch.reshape", "Tensor.contiguous", "Tensor.__getitem__", "torch.zeros",
                     "Tensor.to", "F.dropout", "Tensor.transpose", "Tensor.float"):
            self.assertIsNone(R.canonical(name), name)


class Trace(unittest.TestCase):
    def test_a_task_traces_on_meta_without_memory(self):
        # 65536 x 4096 floats would be a GiB: on meta it costs nothing.
        tr = R.trace_task(TASK)
        self.assertNotIn("error", tr)
        self.assertEqual(tr["ops"], ["linear", "relu", "relu", "relu", "relu", "sum"])
        self.assertEqual(tr["shapes"][0], [65536, 4096])
        # The view passes its producer on: relu -> relu is an edge across x.view().contiguous().
        self.assertIn(["relu", "relu"], tr["edges"])
        self.assertIn(["linear", "relu"], tr["edges"])

    def test_a_task_that_reads_its_data_is_untraced_with_the_reason(self):
        code = TASK.replace("return x.sum(dim=1)", "return x * float(x.max())")
        tr = R.trace_task(code)
        self.assertIn("meta", tr["error"])

    def test_figures_count_heavy_vocabulary_and_pairs(self):
        stats = {"ops": {"linear": 1, "relu": 1}, "pairs": {"linear -> relu": 1}}
        traces = [{"ops": ["linear", "relu", "zeta"], "shapes": [[2, 3], [2, 3], [2, 3]]},
                  {"ops": ["relu", "zeta"], "shapes": [[2, 3, 4, 5], [2, 3, 4, 5]]},
                  {"ops": ["relu"], "shapes": [[7]]},
                  {"error": "RuntimeError: meta"}]
        f = R.figures(traces, stats)
        self.assertEqual((f["tasks"], f["untraced"], f["multi_op"]), (4, 1, 2))
        self.assertEqual(f["heavy_share"], 50.0)           # 1 of 2 multi-op tasks
        self.assertEqual(f["vocab_share"], round(100 * 4 / 6, 1))  # zeta twice is not real
        self.assertEqual(f["pair_share"], round(100 / 3, 1))       # linear->relu of 3 pairs
        self.assertEqual(f["layouts"], {"image": 2, "rows": 3, "vector": 1})


def _seed(name, forward, dist, category="special"):
    return {"id": name, "name": name, "source": "torch", "category": category,
            "spec": {"forward": forward, "init_lines": [], "init_params": [], "inputs": [["x", f"{dist}(8, 256)"]]},
            "inputs": [{"shape": [8, 256], "dtype": "float32"}], "outputs": [{"shape": [8, 256], "dtype": "float32"}]}


class GraphGrammar(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(STATS) as f:
            cls.stats = json.load(f)
        seeds = [_seed("torch.log", "torch.log(x)", "torch.rand"), _seed("torch.rsqrt", "torch.rsqrt(x)",
                 "torch.rand"), _seed("torch.erf", "torch.erf(x)", "torch.randn"),
                 _seed("torch.cholesky", "torch.cholesky(x)", "torch.randn", "linalg"),
                 _seed("torch.sized", "torch.roll(x, features)", "torch.randn")]
        cls.g = CG.Grammar(cls.stats, "cpu", seeds, {"features": 256})

    def test_only_pure_elementwise_like_seeds_are_exotic(self):
        self.assertEqual(sorted(s["name"] for s in self.g.exotic), ["torch.erf", "torch.log", "torch.rsqrt"])

    def test_ops_that_need_positive_inputs_follow_only_a_bound_away_from_zero(self):
        positive_domain = {"torch.log", "torch.rsqrt"}  # their seeds draw torch.rand
        for positive in (False, True):
            placed = set()
            for i in range(200):
                ch = CG.Chain()
                ch.seed_ids = []
                CG._emit_exotic(self.g, ch, CG.State("rows", [1, 64], positive), random.Random(i))
                placed.update(ch.ops)
            self.assertEqual(bool(placed & positive_domain), positive, placed)

    def test_a_clamp_to_eps_is_what_makes_a_tensor_positive(self):
        # Run it: log after clamp(min=1e-05) and a positive scale is finite; the state machine
        # says positive only there (softmax underflows to 0 in float32, so it does not count).
        import torch

        st = CG.State("rows", [1, 256])
        for op in ("softmax", "sigmoid"):
            self.assertFalse(CG._emit(CG.Chain(), st, op, random.Random(0)).positive, op)
        for seed in range(40):
            ch = CG.Chain()
            ch.residual, ch.uses_identity, ch.seed_ids = [1, 256], False, []
            x = CG._emit(ch, st, "clamp", random.Random(seed))
            if not x.positive:
                continue
            x = CG._emit(ch, x, "div", random.Random(seed))
            self.assertTrue(x.positive)
            CG._emit_exotic(self.g, ch, x, random.Random(seed))
            ns = {}
            exec(CG.render(ch, st, 4), ns)  # noqa: S102 - our own generated task
            with torch.no_grad():
                out = ns["Model"]()(*ns["get_inputs"]())
            self.assertTrue(bool(torch.isfinite(out).all()), ch.ops)
            return
        self.fail("no clamp(min=eps) drawn in 40 seeds")

    def test_anchored_chains_hold_a_heavy_op_and_widths_come_from_real_models(self):
        for i in range(300):
            ch, st0 = CG.build_chain(self.g, random.Random(i), 3, True, False)
            self.assertTrue(any(op in CG.HEAVY for op in ch.ops), ch.ops)
            if st0.layout in ("tokens", "rows"):
                self.assertIn(st0.shape[-1], self.g.hidden)
        self.assertIn(4096, self.g.hidden)  # llama's width is in the real table

    def test_the_cost_model_sizes_for_the_target(self):
        for i in range(100):
            rng = random.Random(i)
            res = CG.graph_candidate(self.g, rng, 2, 10.0, 0.9, 0.0)
            if res["ok"]:
                self.assertLess(abs(__import__("math").log(res["estimated_ms"] / 10.0)), __import__("math").log(4))


if __name__ == "__main__":
    unittest.main()


class SolvePrompt(unittest.TestCase):
    def test_the_task_code_is_filled_once_and_a_missing_value_is_an_error(self):
        from opforge import prompts

        msgs = prompts.solve_messages("class Model: x = '{{task_code}}'", os.path.join(REPO, "data"))
        self.assertEqual([m["role"] for m in msgs], ["system", "user"])
        self.assertIn("class Model: x = '{{task_code}}'", msgs[1]["content"])  # not expanded again
        with self.assertRaises(KeyError):
            prompts.fill("{{ other }}", {"task_code": ""})
