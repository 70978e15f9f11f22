"""Unit tests of timing.fixed_cost_ms and time_calls with two batch sizes: the fixed cost of a
trial is the intercept of time against calls, held between the trusted floor and floor + margin.

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import os
import sys
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

from opforge import judge, timing  # noqa: E402


def line(a, b, sizes, reps=5):
    """Trials that cost a + b * calls, each size `reps` times, alternating as time_calls takes them."""
    return [(n, a + b * n) for _ in range(reps) for n in sizes]


class FixedCost(unittest.TestCase):
    def test_the_intercept_of_a_line_is_its_fixed_cost(self):
        fixed, intercept = timing.fixed_cost_ms(line(0.9, 0.56, (23, 5)), (23, 5), floor_ms=0.25, margin_ms=1.0)
        self.assertAlmostEqual(intercept, 0.9)
        self.assertAlmostEqual(fixed, 0.9)

    def test_small_trials_made_slow_buy_at_most_the_margin(self):
        # A solution that knows it was asked for few calls and waits: the estimate stops at floor + margin.
        samples = [(n, ms + (40.0 if n == 5 else 0.0)) for n, ms in line(0.9, 0.56, (23, 5))]
        fixed, intercept = timing.fixed_cost_ms(samples, (23, 5), floor_ms=0.25, margin_ms=1.0)
        self.assertGreater(intercept, 10.0)
        self.assertAlmostEqual(fixed, 1.25)

    def test_an_intercept_under_the_floor_is_the_floor(self):
        fixed, intercept = timing.fixed_cost_ms(line(-0.3, 0.56, (23, 5)), (23, 5), floor_ms=0.25, margin_ms=1.0)
        self.assertAlmostEqual(intercept, -0.3)
        self.assertEqual(fixed, 0.25)

    def test_one_size_or_no_margin_is_the_floor_alone(self):
        self.assertEqual(timing.fixed_cost_ms(line(0.9, 0.56, (23,)), (23,), 0.25, 1.0), (0.25, None))
        self.assertEqual(timing.fixed_cost_ms(line(0.9, 0.56, (23, 5)), (23, 5), 0.25, 0.0), (0.25, None))

    def test_the_median_of_each_size_resists_one_disturbed_trial(self):
        samples = line(0.9, 0.56, (23, 5))
        samples[1] = (5, samples[1][1] + 30.0)  # one small trial preempted
        fixed, _ = timing.fixed_cost_ms(samples, (23, 5), floor_ms=0.0, margin_ms=2.0)
        self.assertAlmostEqual(fixed, 0.9)

    def test_each_pair_of_trials_gives_its_own_figure_and_the_median_is_taken(self):
        # The machine's state drifts from pair to pair (an offset and a rate both trials of a pair
        # share): each pair's line is exact, so the median of the pairs is the per-call time.
        samples = []
        for i, (d, r) in enumerate([(0.0, 1.0), (0.4, 1.03), (0.1, 0.99), (0.9, 1.02), (0.2, 1.0)]):
            samples += [(23, 0.9 + d + 0.56 * r * 23), (5, 0.9 + d + 0.56 * r * 5)]
        stats = timing._per_call(samples, (23, 5), floor_ms=0.25, margin_ms=2.0)
        self.assertAlmostEqual(stats["median_ms"], 0.56)
        self.assertEqual(stats["pairs"], 5)
        self.assertAlmostEqual(stats["fixed_ms"], 1.1)

    def test_a_pair_whose_small_trial_was_made_slow_is_held_to_the_margin(self):
        samples = line(0.9, 0.56, (23, 5))
        samples = [(n, ms + (40.0 if n == 5 else 0.0)) for n, ms in samples]
        stats = timing._per_call(samples, (23, 5), floor_ms=0.25, margin_ms=1.0)
        self.assertAlmostEqual(stats["fixed_ms"], 1.25)
        self.assertAlmostEqual(stats["median_ms"], (0.9 + 0.56 * 23 - 1.25) / 23)

    def test_the_second_size_is_a_quarter_of_a_gpu_batch(self):
        self.assertEqual(judge.small_batch(23, "cuda:0"), 5)
        self.assertEqual(judge.small_batch(3, "cuda:0"), 0)  # too few calls for two sizes
        self.assertEqual(judge.small_batch(23, "cpu"), 0)  # the CPU keeps one size, as it has no floor


class TwoSizeTrials(unittest.TestCase):
    """time_calls itself, on calls that sleep a fixed 4 ms plus 1 ms a call (the host's clock)."""

    @staticmethod
    def timed(margin_ms, sizes_seen):
        def call(n):
            sizes_seen.append(n)
            time.sleep(0.004 + 0.001 * n)
        return timing.time_calls(call, "cpu", warmup=1, trials=5, budget_s=30.0, per_call=8, small=2,
                                 margin_ms=margin_ms)

    def test_the_trials_alternate_and_the_fixed_cost_comes_off(self):
        seen = []
        stats = self.timed(20.0, seen)
        self.assertEqual(seen, [8] + [8, 2] * 5)
        self.assertEqual(stats["trials"], 5)
        self.assertGreater(stats["fixed_ms"], 3.5)  # the sleeps' 4 ms, less the scheduler's noise
        self.assertLess(abs(stats["median_ms"] - 1.0), 0.3)

    def test_the_margin_bounds_what_comes_off(self):
        stats = self.timed(1.0, [])
        self.assertEqual(stats["fixed_ms"], 1.0)
        self.assertGreater(stats["median_ms"], 1.3)  # (12 - 1) / 8 and more


if __name__ == "__main__":
    unittest.main()
