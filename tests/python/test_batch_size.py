"""Unit tests of judge.batch_size: how many calls one timed batch of the judge holds.

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import os
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

from opforge import judge  # noqa: E402


class BatchSize(unittest.TestCase):
    def test_a_batch_aims_at_the_target_time(self):
        target = judge.BATCH_MS["cpu"]
        self.assertEqual(judge.batch_size(target / 4, 1024, "cpu"), 4)
        self.assertEqual(judge.batch_size(target / 4.5, 1024, "cpu"), 5)  # rounded up: at least the target

    def test_a_call_longer_than_the_target_is_timed_alone(self):
        self.assertEqual(judge.batch_size(judge.BATCH_MS["cpu"] * 3, 1024, "cpu"), 1)

    def test_tiny_calls_stop_at_the_cap(self):
        self.assertEqual(judge.batch_size(1e-6, 1024, "cpu"), judge.MAX_BATCH)

    def test_memory_bounds_the_batch(self):
        # Each call's input slot and kept output must fit the budget together.
        per_call = judge.SLOT_BUDGET_CPU // 3 + 1
        self.assertEqual(judge.batch_size(1e-3, per_call, "cpu"), 2)

    def test_a_call_bigger_than_the_budget_still_runs_once(self):
        self.assertEqual(judge.batch_size(1e-3, judge.SLOT_BUDGET_CPU * 4, "cpu"), 1)


if __name__ == "__main__":
    unittest.main()
