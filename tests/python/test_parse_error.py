"""The judge's load_error for a one-file solution that does not parse (judge.parse_error), given
without a discovery child: it must be the child's own verdict word for word (candidate._exec_module,
the code the child runs), and say nothing where the child's import decides otherwise.

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import os
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

from opforge import candidate, judge  # noqa: E402

GOOD = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


class ParseError(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def _file(self, data):
        path = os.path.join(self.dir.name, "model_new.py")
        with open(path, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return path

    def _child_says(self, path):
        try:
            candidate._exec_module(path)
        except candidate.Refused as e:
            return e.reason, str(e)
        return None, None

    def test_what_does_not_parse_gets_the_childs_own_verdict(self):
        broken = [
            GOOD.replace("def forward(self, x)", "def forward(self,, x)"),  # a copy error
            GOOD.replace("        return x", "      return x\n        pass"),  # IndentationError
            GOOD.replace("        return x", "\treturn x\n        return x"),  # TabError
            GOOD + "class ModelNew(",  # cut at the token limit
            GOOD.replace("return x", "return x +"),
            "x = '''never closed\n" + GOOD,
            "\ufeff" + GOOD,  # a BOM: the child's UTF-8 read keeps it, and so does this one
            "x = " + "(" * 300 + "1" + ")" * 300 + "\n" + GOOD,  # too deep for the parser
        ]
        for src in broken:
            path = self._file(src)
            reason, detail = self._child_says(path)
            self.assertEqual(reason, "load_error", src)
            self.assertEqual(judge.parse_error(path), detail, src)

    def test_what_parses_or_fails_otherwise_is_left_to_the_child(self):
        self.assertIsNone(judge.parse_error(self._file(GOOD)))
        # Parses, fails at run time: the child's import decides.
        self.assertIsNone(judge.parse_error(self._file(GOOD + "raise SystemExit(3)\n")))
        # Not UTF-8 (the child's read fails its own way), and a missing file (no_model_new there).
        self.assertIsNone(judge.parse_error(self._file(b"x = '\xff'\n" + GOOD.encode())))
        self.assertIsNone(judge.parse_error(self._file(b"x = 1\x00\n" + GOOD.encode())))  # null bytes: ValueError
        self.assertIsNone(judge.parse_error(self._file(GOOD.replace("\n", "\r\n"))))  # CRLF parses
        self.assertIsNone(judge.parse_error(os.path.join(self.dir.name, "absent.py")))


if __name__ == "__main__":
    unittest.main()
