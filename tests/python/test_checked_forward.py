"""What a solution's child runs around a checked call (python/opforge/candidate.py): under strict
the guard and the dispatcher-level profiler, whose ops the judge weighs; under torch-allowed
neither, since the judge weighs no op evidence there and a process's first profiler session costs
seconds (most of an untimed answer's time on a GPU).

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import os
import sys
import unittest

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

from opforge import candidate  # noqa: E402


class _Seen(torch.nn.Module):
    """Records whether a profiler was on while it ran; computes only a view (allowed by strict)."""

    def __init__(self):
        super().__init__()
        self.profiled = []

    def forward(self, x):
        self.profiled.append(torch.autograd.profiler._is_profiler_enabled)  # set by torch.profiler.profile
        return x.view(-1)


def _checked(policy):
    st = candidate.State(chan=None)
    st.policy, st.model = policy, _Seen()
    st.slots = [[torch.arange(6.0).reshape(2, 3)]]
    out, error, evidence = candidate._checked_forward(st)
    return st.model, out, error, evidence


class CheckedForward(unittest.TestCase):
    def test_strict_runs_the_call_under_the_profiler_and_reports_its_ops(self):
        model, out, error, evidence = _checked("strict")
        self.assertIsNone(error)
        self.assertEqual(model.profiled, [True])
        self.assertIn("aten::view", evidence["ops"])
        self.assertEqual(evidence["guard"], [])
        self.assertTrue(torch.equal(out, torch.arange(6.0)))

    def test_torch_allowed_runs_the_call_without_a_profiler(self):
        model, out, error, evidence = _checked("torch-allowed")
        self.assertIsNone(error)
        self.assertEqual(model.profiled, [False])
        self.assertEqual(evidence["ops"], [])
        self.assertTrue(torch.equal(out, torch.arange(6.0)))

    def test_an_error_of_the_call_is_returned_under_either_policy(self):
        for policy in ("strict", "torch-allowed"):
            st = candidate.State(chan=None)
            st.policy, st.model = policy, torch.nn.Linear(4, 4)
            st.slots = [[torch.zeros(2, 3)]]  # the wrong width: the call raises
            out, error, _ = candidate._checked_forward(st)
            self.assertIsNone(out)
            self.assertIsInstance(error, RuntimeError, policy)


class WarmProfiler(unittest.TestCase):
    """A strict judge's spares start the profiler up before a solution comes (op_warm), so its
    first check does not pay Kineto's start; the warm-up must leave nothing on and see nothing of
    a solution's."""

    def test_warm_with_profiler_runs_one_session_and_leaves_it_off(self):
        st = candidate.State(chan=None)
        reply = candidate.op_warm(st, {"op": "warm", "profiler": True}, ())
        self.assertGreaterEqual(reply["profiler_warm_s"], 0.0)
        self.assertFalse(torch.autograd.profiler._is_profiler_enabled)
        # A strict check after it is observed as before.
        st.policy, st.model = "strict", _Seen()
        st.slots = [[torch.arange(6.0).reshape(2, 3)]]
        _, error, evidence = candidate._checked_forward(st)
        self.assertIsNone(error)
        self.assertEqual(st.model.profiled, [True])
        self.assertIn("aten::view", evidence["ops"])

    def test_plain_warm_starts_no_profiler(self):
        self.assertEqual(candidate.op_warm(candidate.State(chan=None), {"op": "warm"}, ()), {})

    def test_warm_with_profiler_is_refused_once_a_solution_is_in(self):
        st = candidate.State(chan=None)
        st.model = _Seen()
        with self.assertRaises(candidate.Refused):
            candidate.op_warm(st, {"op": "warm", "profiler": True}, ())


@unittest.skipUnless(os.environ.get("OPFORGE_TEST_EXE"), "set OPFORGE_TEST_EXE to build/opforge (ctest does)")
class SpareWarmReply(unittest.TestCase):
    """The judge posts a spare's warm-up and collects its reply when a solution takes the spare:
    what the reply said (the profiler's start-up seconds) is kept for the solution's row."""

    def test_a_posted_profiler_warm_up_is_collected_with_its_seconds(self):
        from opforge import judge

        launch = {"exe": os.environ["OPFORGE_TEST_EXE"], "mode": "off",
                  "spec": {"env": {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}}}
        with open(os.devnull, "ab") as log:
            child = judge.Child(launch, log, timeout_s=120)
            try:
                child.post("warm", "warming the profiler", profiler=True)
                child.must("floor", "measuring the floor")  # collects the warm-up's reply first
                self.assertGreater(child.collected["warm"]["profiler_warm_s"], 0.0)
                self.assertEqual(child.collected["warm"].keys(), {"profiler_warm_s"})
            finally:
                child.close()


if __name__ == "__main__":
    unittest.main()
