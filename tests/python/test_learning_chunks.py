"""The learning run's PPO chunks near the end of a call (bench/learning_run.py `chunk_end`): a seed
whose next eval point does not fit before --stop-after-s trains the steps that fit, and stops only
when not one does; the first unit of a call always runs.

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import argparse
import os
import sys
import tempfile
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))

import learning_run as L  # noqa: E402


class ChunkEnd(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.t0 = L.T0
        args = argparse.Namespace(out=self.dir.name, stop_after_s=100.0)
        self.run = L.Run(args, cfg={"eval_every": 4})
        self.run.units = 1  # a unit already finished in this call

    def tearDown(self):
        L.T0 = self.t0
        L.STOPPING.clear()
        self.dir.cleanup()

    def _at(self, elapsed_s, per_step_s=None):
        """The call has run elapsed_s; the last PPO piece took per_step_s a step."""
        L.T0 = time.time() - elapsed_s
        if per_step_s:
            self.run.state["estimates"] = {"ppo_step": per_step_s}

    def test_the_whole_chunk_when_it_fits(self):
        self._at(45, per_step_s=10)  # 55 s left: 4 steps and a trainer's start
        self.assertEqual(L.chunk_end(self.run, 0, 0, 4), 4)

    def test_the_steps_that_fit_when_the_chunk_does_not(self):
        self._at(64, per_step_s=10)  # 36 s left: 2 steps and a start
        self.assertEqual(L.chunk_end(self.run, 0, 4, 8), 6)
        self._at(74, per_step_s=10)  # 26 s: one step
        self.assertEqual(L.chunk_end(self.run, 0, 4, 8), 5)

    def test_a_split_chunk_goes_on_to_its_point(self):
        self._at(45, per_step_s=10)
        self.assertEqual(L.chunk_end(self.run, 0, 6, 8), 8)

    def test_stop_when_not_one_step_fits(self):
        self._at(85, per_step_s=10)  # 15 s left: a start and a step are 20
        with self.assertRaises(L.Stop):
            L.chunk_end(self.run, 0, 4, 8)

    def test_no_split_without_a_measured_step_or_a_cap(self):
        self._at(99)  # no estimate yet: the whole chunk (may_start has nothing to weigh)
        self.assertEqual(L.chunk_end(self.run, 0, 0, 4), 4)
        self.run.args.stop_after_s = 0
        self._at(500, per_step_s=10)
        self.assertEqual(L.chunk_end(self.run, 0, 0, 4), 4)

    def test_the_first_unit_of_a_call_always_runs_whole(self):
        self.run.units = 0
        self._at(95, per_step_s=10)
        self.assertEqual(L.chunk_end(self.run, 0, 0, 4), 4)


if __name__ == "__main__":
    unittest.main()
