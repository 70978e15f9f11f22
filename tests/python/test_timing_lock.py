"""Unit tests of timing's lock waits: bounded, and a lock held from the solution's tree is said so.

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import os
import subprocess
import sys
import tempfile
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

from opforge import timing  # noqa: E402

# A process that takes a shared flock on argv[1], says so, and keeps it until killed; with argv[2]
# "child" it does so from a child of its own (a solution's subprocess).
HOLDER = r"""
import fcntl, os, sys, time
def hold():
    f = open(sys.argv[1], "a")
    fcntl.flock(f, fcntl.LOCK_SH)
    print("held", flush=True)
    time.sleep(600)
if sys.argv[2] == "child":
    if os.fork() == 0:
        hold()
    os.wait()
else:
    hold()
"""


class LockWait(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.lock = os.path.join(self.dir.name, "gpu0.lock")
        self.procs = []
        self.limit, self.suspects = timing.LOCK_LIMIT_S, list(timing.SUSPECTS)

    def tearDown(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()
            p.stdout.close()
        timing.LOCK_LIMIT_S, timing.SUSPECTS[:] = self.limit, self.suspects
        self.dir.cleanup()

    def _hold(self, how="self"):
        p = subprocess.Popen([sys.executable, "-c", HOLDER, self.lock, how], stdout=subprocess.PIPE,
                             start_new_session=True)
        self.procs.append(p)
        self.assertEqual(p.stdout.readline().strip(), b"held")
        return p

    def _wait_exclusive(self):
        t0 = time.monotonic()
        with self.assertRaises(timing.LockHeld) as cm:
            with timing.exclusive(self.lock):
                self.fail("the exclusive lock was taken while another process held it shared")
        return cm.exception, time.monotonic() - t0

    def test_a_lock_held_from_the_solutions_tree_ends_the_wait_naming_it(self):
        p = self._hold("child")
        timing.SUSPECTS[:] = [p.pid]
        err, waited = self._wait_exclusive()
        self.assertTrue(err.by_suspect)
        self.assertEqual(len(err.holders), 1)
        self.assertNotEqual(err.holders[0], p.pid, "the holder is the solution's child's child")
        self.assertIn("a process of the solution", str(err))
        self.assertLess(waited, 10)

    def test_a_neighbours_lock_is_waited_for_up_to_the_limit_then_an_error_of_the_environment(self):
        p = self._hold()
        solution = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a tree the holder is not in
        self.addCleanup(solution.wait)
        self.addCleanup(solution.kill)
        timing.SUSPECTS[:] = [solution.pid]
        timing.LOCK_LIMIT_S = 1.0
        err, waited = self._wait_exclusive()
        self.assertFalse(err.by_suspect)
        self.assertEqual(err.holders, [p.pid])
        self.assertGreaterEqual(waited, 1.0)

    def test_a_lock_let_go_is_taken(self):
        p = self._hold()
        timing.LOCK_LIMIT_S = 30.0
        t0 = time.monotonic()
        killer = subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -9 {p.pid}"])
        with timing.exclusive(self.lock):
            waited = time.monotonic() - t0
        killer.wait()
        self.assertGreaterEqual(waited, 0.4)
        self.assertLess(waited, 10)


if __name__ == "__main__":
    unittest.main()
