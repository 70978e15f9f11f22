"""Dedup's structural features (python/opforge/features.py): a copy that renames the file's own
helpers or respells an op keeps its op tokens (bench/decontam_recall.sh measures the recall)."""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from opforge import features as F  # noqa: E402

RESNETISH = '''
import torch
import torch.nn as nn

class {block}(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) + x

class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3)
        self.{layer} = self.{make}(c)
        self.head = {block}(c)

    def {make}(self, c):
        return nn.Sequential({block}(c), {block}(c))

    def forward(self, x):
        return self.head(self.{layer}(self.stem(x)))
'''


def _op_tokens(code):
    return {k: v for k, v in F.features_of(code)["tokens"].items() if k.startswith("op:")}


class Features(unittest.TestCase):
    def test_the_files_own_names_are_not_op_tokens(self):
        a = RESNETISH.format(block="BasicBlock", layer="layer1", make="_make_layer")
        b = RESNETISH.format(block="q5", layer="q7", make="q2")
        self.assertEqual(_op_tokens(a), _op_tokens(b))
        self.assertIn("op:localmodule", _op_tokens(a))

    def test_one_token_per_computation_whatever_the_spelling(self):
        spellings = ["torch.relu(x)", "F.relu(x)", "x.relu_()", "self.act(x)"]
        head = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
        init = "    def __init__(self):\n        super().__init__()\n        self.act = nn.ReLU()\n"
        tokens = [_op_tokens(f"{head}class Model(nn.Module):\n{init}    def forward(self, x):\n        return {s}\n")
                  for s in spellings]
        for t in tokens:
            self.assertEqual(t, {"op:relu": 1}, t)
        self.assertEqual(F.op_token("nn.LayerNorm"), F.op_token("F.layer_norm"))
        self.assertNotEqual(F.op_token("nn.Conv2d"), F.op_token("nn.Conv3d"))


if __name__ == "__main__":
    unittest.main()
