"""The learning run's paired comparison (bench/learning_run.py `paired`): each seed's answers
against the SFT model's on the same test tasks, with an interval from resampling the tasks; and
the per-prompt table of a PPO chunk's rollout rewards (`rollout_rewards`) and the summary's PPO means
(`train_mean`), its line on how SFT ended (`sft_line`), and every
PPO point pooled against SFT (`paired_all`).

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import json
import os
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))

import learning_run as L  # noqa: E402


def _write(path, rewards):
    with open(path, "w") as f:
        for t, r in rewards.items():
            f.write(json.dumps({"task_id": t, "reward": r}) + "\n")


class Paired(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def _run(self, sft, per_seed, step=2):
        _write(os.path.join(self.out, "eval_sft.jsonl"), sft)
        seeds = []
        for s, rewards in enumerate(per_seed):
            _write(os.path.join(self.out, f"eval_seed{s}_step{step}.jsonl"), rewards)
            seeds.append({"seed": s, "eval": [{"step": step}]})
        return L.paired(self.out, seeds, step)

    def test_flips_are_counted_per_seed_and_the_interval_holds_the_change(self):
        tasks = [f"t{i}" for i in range(40)]
        sft = {t: (1.0 if i < 20 else -1.0) for i, t in enumerate(tasks)}
        a = dict(sft, t20=1.0, t21=1.0, t0=-1.0)  # 2 right, 1 wrong
        b = dict(sft, t22=1.0)                     # 1 right
        p = self._run(sft, [a, b])
        self.assertEqual((p["gains"], p["losses"], p["seeds"], p["tasks"]), (3, 1, 2, 40))
        self.assertAlmostEqual(p["delta_pass_at_1"], ((2 - 1) / 40 + 1 / 40) / 2)
        self.assertLessEqual(p["ci95"][0], p["delta_pass_at_1"])
        self.assertGreaterEqual(p["ci95"][1], p["delta_pass_at_1"])
        self.assertLess(p["ci95"][0], 0.0)  # 3 flips up and 1 down over 40 tasks: not clearly a rise

    def test_a_rise_on_every_task_has_an_interval_above_zero(self):
        tasks = [f"t{i}" for i in range(30)]
        sft = {t: -1.0 for t in tasks}
        p = self._run(sft, [{t: 1.0 for t in tasks}] * 3)
        self.assertEqual(p["delta_pass_at_1"], 1.0)
        self.assertEqual(p["ci95"], [1.0, 1.0])
        self.assertEqual((p["gains"], p["losses"]), (90, 0))

    def test_unjudged_answers_and_missing_points_are_left_out(self):
        sft = {"a": 1.0, "b": -1.0, "c": None}
        p = self._run(sft, [{"a": 1.0, "b": None, "c": 1.0}])
        self.assertEqual(p["tasks"], 1)  # only "a" has a verdict on both sides
        self.assertIsNone(L.paired(self.out, [{"seed": 0, "eval": [{"step": 2}]}], 4))

    def test_every_point_of_every_seed_pooled_per_task(self):
        tasks = [f"t{i}" for i in range(20)]
        sft = {t: -1.0 for t in tasks}
        _write(os.path.join(self.out, "eval_sft.jsonl"), sft)
        # seed 0 right on t0 at step 2 and on t0, t1 at step 4; seed 1 (one point) right on t2
        evals = {(0, 2): ["t0"], (0, 4): ["t0", "t1"], (1, 2): ["t2"]}
        for (seed, step), right in evals.items():
            _write(os.path.join(self.out, f"eval_seed{seed}_step{step}.jsonl"),
                   dict(sft, **{t: 1.0 for t in right}))
        seeds = [{"seed": 0, "eval": [{"step": 2}, {"step": 4}]}, {"seed": 1, "eval": [{"step": 2}]}]
        p = L.paired_all(self.out, seeds)
        self.assertEqual((p["step"], p["evals"], p["seeds"], p["tasks"]), ("all", 3, 2, 20))
        self.assertAlmostEqual(p["delta_pass_at_1"], (2 / 3 + 1 / 3 + 1 / 3) / 20)
        self.assertEqual((p["gains"], p["losses"]), (4, 0))
        self.assertIn("3 evals of 2 seed(s), 20 tasks", L.pooled_line(p))
        # t0 right in 2 of 3 evals, t1 and t2 in 1: some; the other 17 in none; SFT had none right
        self.assertEqual(p["by_task"], {"sft_wrong": 20, "right_in_all": 0, "right_in_some": 3,
                                        "right_in_none": 17, "sft_right_wrong_in_some": 0})
        self.assertIn("3 in some, 17 in none", L.pooled_line(p))
        self.assertIsNone(L.paired_all(self.out, []))

    def test_turns_by_task_separate_every_eval_from_some(self):
        sft = {"a": -1.0, "b": -1.0, "c": 1.0, "d": 1.0}
        p = self._run(sft, [{"a": 1.0, "b": 1.0, "c": 1.0, "d": -1.0}, {"a": 1.0, "b": -1.0, "c": 1.0, "d": 1.0}])
        self.assertEqual(p["by_task"], {"sft_wrong": 2, "right_in_all": 1, "right_in_some": 1, "right_in_none": 0,
                                        "sft_right_wrong_in_some": 1})


class RolloutRewards(unittest.TestCase):
    """What comes back of a PPO chunk's trajectories: one row per step and prompt, its answers'
    rewards in the order drawn (a null reward kept as None) and their lengths."""

    def test_answers_are_grouped_by_step_and_task(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trajectories.jsonl")
            rows = [(1, "a", 1.0, 3), (1, "b", -1.0, 5), (1, "a", -1.0, 2), (2, "a", None, 4), (1, "b", -1.0, 1)]
            with open(path, "w") as f:
                for step, task, reward, n in rows:
                    f.write(json.dumps({"step": step, "task_id": task, "reward": reward, "ids": [0] * 9,
                                        "logprobs": [0.0] * n}) + "\n")
            self.assertEqual(L.rollout_rewards(path), [
                {"step": 1, "task_id": "a", "rewards": [1.0, -1.0], "tokens": [3, 2]},
                {"step": 1, "task_id": "b", "rewards": [-1.0, -1.0], "tokens": [5, 1]},
                {"step": 2, "task_id": "a", "rewards": [None], "tokens": [4]}])
            self.assertEqual(L.rollout_rewards(os.path.join(d, "absent.jsonl")), [])


class TrainMean(unittest.TestCase):
    def test_the_steps_between_two_eval_points_of_the_seeds_evaluated_there(self):
        at = lambda *steps: [{"step": st} for st in steps]  # noqa: E731
        seeds = [{"eval": at(3), "train_metrics": [{"step": 1, "mixed_groups": 0.5}, {"step": 2, "mixed_groups": 0.25},
                                                   {"step": 3, "mixed_groups": 1.0}]},
                 {"eval": at(3), "train_metrics": [{"step": 2, "mixed_groups": 0.0}, {"step": 3}]},
                 # trained past its last eval point (cut, or still running): not in step 3's row
                 {"eval": at(), "train_metrics": [{"step": 2, "mixed_groups": 0.9}]},
                 # the judge scored none of step 2's answers: its zeros are no measurement
                 {"eval": at(3), "train_metrics": [{"step": 2, "mixed_groups": 0.0, "answers": 8, "dropped": 8},
                                                   {"step": 3, "mixed_groups": 0.5, "answers": 8, "dropped": 1}]}]
        self.assertAlmostEqual(L.train_mean(seeds, 1, 3, "mixed_groups"), (0.25 + 1.0 + 0.0 + 0.5) / 4)
        self.assertIsNone(L.train_mean(seeds, 3, 4, "mixed_groups"))  # no seed evaluated there
        self.assertIsNone(L.train_mean(seeds, 0, 3, "kl_ref"))  # a metric no step logged


class SftLine(unittest.TestCase):
    def test_the_summary_says_how_sft_ended(self):
        res = {"model": {"params": 1032576}, "sft": {"steps": 2500, "stopped": "val_loss plateaued (3 chunks without "
                                                      "a 1% gain)", "val_curve": [{"step": 500, "val_loss": 0.2},
                                                                                  {"step": 1000, "val_loss": 0.05}]}}
        self.assertEqual(L.sft_line(res), "SFT: 1.03M parameters, 2500 steps, best val loss 0.0500, ended: val_loss "
                                          "plateaued (3 chunks without a 1% gain).")
        self.assertIn("ended: not yet", L.sft_line({"model": {"params": 10}, "sft": {}}))

if __name__ == "__main__":
    unittest.main()
