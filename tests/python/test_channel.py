"""Unit tests of shm.Channel, the judge's wire to a solution's process.

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import os
import signal
import sys
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

from opforge import shm  # noqa: E402


class Channel(unittest.TestCase):
    def setUp(self):
        self.a, theirs = shm.Channel.pair()
        self.b = shm.Channel(theirs)
        # A read that blocks where it should poll is a failure here, not a hang.
        signal.signal(signal.SIGALRM, self._hung)
        signal.alarm(10)

    @staticmethod
    def _hung(*_):
        raise AssertionError("the channel blocked for 10 s")

    def tearDown(self):
        signal.alarm(0)
        self.a.close()
        self.b.close()

    def test_a_spin_with_nothing_to_read_gives_up_and_the_timeout_holds(self):
        # The spin must poll (a blocking read there would hang on a silent peer).
        t0 = time.perf_counter()
        with self.assertRaises(shm.WireError) as e:
            self.a.recv(timeout=0.3, spin_s=0.1)
        self.assertEqual(e.exception.reason, "timeout")
        self.assertLess(time.perf_counter() - t0, 5.0)

    def test_a_spin_returns_the_message_and_its_descriptors(self):
        r, w = os.pipe()
        try:
            self.b.send({"op": "bind", "n": 1}, fds=[r])
            msg, fds = self.a.recv(timeout=5, spin_s=1.0)
            self.assertEqual(msg, {"op": "bind", "n": 1})
            self.assertEqual(len(fds), 1)
            os.write(w, b"x")
            self.assertEqual(os.read(fds[0], 1), b"x")  # the same pipe, passed across
            os.close(fds[0])
        finally:
            os.close(r)
            os.close(w)

    def test_nan_or_infinity_from_the_peer_is_a_protocol_error(self):
        for word in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e400", b"9" * 400):
            self.b.sock.sendall(b'{"t0": ' + word + b'}')
            with self.assertRaises(shm.WireError) as e:
                self.a.recv(timeout=5)
            self.assertEqual(e.exception.reason, "protocol_error")

    def test_ordinary_numbers_still_cross(self):
        self.b.send({"t0": 12345.678, "n": -(2 ** 62), "x": 1e-300})
        self.assertEqual(self.a.recv(timeout=5)[0], {"t0": 12345.678, "n": -(2 ** 62), "x": 1e-300})

    def test_a_blocking_read_gets_the_message(self):
        self.b.send({"seq": 3})
        self.assertEqual(self.a.recv(timeout=5)[0], {"seq": 3})


if __name__ == "__main__":
    unittest.main()
