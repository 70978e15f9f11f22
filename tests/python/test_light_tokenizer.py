"""opforge.light_tokenizer (the trainer's tokenizer without transformers' import) against
transformers itself, through opforge.tokenizer's and opforge.chat_tools' functions: the same ids,
texts, chat rows and errors, on tokenizers trained offline with two chat templates (the SFT
fixture's and one with tools, `tojson`, loop controls, a generation tag and raise_exception).

Run from the repo root:  .venv/bin/python3 -m unittest discover -s tests/python
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

from chat_fixture import MARKERS, bpe_tokenizer  # noqa: E402
from opforge import chat_tools, light_tokenizer, tokenizer  # noqa: E402

TEXTS = ["def forward(self, x): return torch.relu(x) + 1", "héllo wörld — ünïcode ✓ and 'quotes' <tags>",
         "__global__ void add(float* a, const float* b, int n) { a[i] += b[i]; }"] * 20
# A template of our own that uses what real ones use: tools printed with tojson (indent, non-ASCII),
# a system default, loop controls, a {% generation %} block, raise_exception, the eos token.
TOOLS_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}{% set sys = messages[0].content %}{% set rest = messages[1:] %}"
    "{%- else %}{% set sys = 'You write kernels.' %}{% set rest = messages %}{% endif %}"
    "<|system|>{{ sys }}"
    "{%- if tools %}\n{% for t in tools %}{{ t | tojson(indent=2) }}\n{% endfor %}{% endif %}<|end|>\n"
    "{%- for m in rest %}"
    "{%- if m.role == 'system' %}{{ raise_exception('system only first') }}{% endif %}"
    "{%- if m.role == 'tool' and loop.index0 > 40 %}{% break %}{% endif %}"
    "<|{{ m.role }}|>"
    "{%- if m.role == 'assistant' %}{% generation %}{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<|call|>{{ c.function.name }} {{ c.function.arguments | tojson }}"
    "{%- endfor %}{{ eos_token }}{% endgeneration %}"
    "{%- else %}{{ m.content }}{% endif %}<|end|>\n"
    "{%- endfor %}\n"
    "    {% if add_generation_prompt %}<|assistant|>{% endif %}")  # trim_blocks and lstrip_blocks eat the blanks
TOOLS = [{"type": "function", "function": {"name": "run", "description": "run a command — héllo",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
CHAT = [{"role": "user", "content": "write ModelNew for <tags> héllo"},
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"type": "function", "function": {"name": "run", "arguments": "{\"cmd\": \"nvcc -O3 k.cu\"}"}}]},
        {"role": "tool", "content": "compiled ✓"},
        {"role": "assistant", "content": "def forward(self, x): return torch.relu(x) + 1"}]


def _call(fn, req):
    return json.loads(fn(json.dumps(req)))


class LightTokenizer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        tok = bpe_tokenizer(TEXTS, 400, MARKERS)
        cls.plain = os.path.join(cls.dir, "plain")
        tok.save_pretrained(cls.plain)
        tok.chat_template = TOOLS_TEMPLATE
        cls.tools = os.path.join(cls.dir, "tools")
        tok.save_pretrained(cls.tools)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def both(self, fn, req):
        """fn's reply with the light tokenizer and with transformers' (a fresh cache each)."""
        out = []
        for mode in ("light", "transformers"):
            tokenizer._CACHE.clear()
            os.environ["OPFORGE_TOKENIZER"] = mode
            try:
                out.append(_call(fn, req))
            finally:
                os.environ.pop("OPFORGE_TOKENIZER")
        tokenizer._CACHE.clear()
        return out

    def test_the_light_path_is_taken_for_these_folders(self):
        for d in (self.plain, self.tools):
            self.assertIsInstance(light_tokenizer.load(d), light_tokenizer.LightTokenizer)

    def test_info_encode_decode_match_transformers(self):
        for d in (self.plain, self.tools):
            light, ref = self.both(tokenizer.info, {"model": d})
            self.assertEqual(light, ref)
            for text in TEXTS[:3] + ["<|assistant|>x<eos><pad>", "", "  spaces\n\n\ttabs"]:
                light, ref = self.both(tokenizer.encode, {"model": d, "text": text})
                self.assertEqual(light, ref, text)
                info = self.both(tokenizer.info, {"model": d})[1]
                ids = ref["ids"] + [info["eos_id"], info["pad_id"]]  # special tokens to skip or keep
                for skip in (True, False):
                    light, ref = self.both(tokenizer.decode, {"model": d, "ids": ids, "skip_special": skip})
                    self.assertEqual(light, ref, (text, skip))

    def test_chat_rendering_and_sft_rows_match_transformers(self):
        for d in (self.plain, self.tools):
            for tools in (None, TOOLS):
                req = {"model": d, "messages": CHAT[:1]}
                if tools:
                    req["tools"] = tools
                light, ref = self.both(tokenizer.encode, req)
                self.assertEqual(light, ref)
                rec = {"messages": CHAT, "tools": tools} if tools else {"messages": CHAT}
                light, ref = self.both(tokenizer.chat_tokens, {"model": d, "records": [rec], "max_len": 0})
                self.assertEqual(light, ref)
                self.assertIn("ids", light["rows"][0])
                srv = {"model": d, "messages": json.dumps(CHAT[:3]), "tools": json.dumps(tools) if tools else None}
                light, ref = self.both(chat_tools.encode, srv)
                self.assertEqual(light, ref)

    def test_template_errors_are_the_same_errors(self):
        bad = [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]
        light, ref = self.both(chat_tools.encode, {"model": self.tools, "messages": json.dumps(bad), "tools": None})
        self.assertIn("system only first", light["error"])
        self.assertEqual(light, ref)

    def test_folders_the_light_path_does_not_claim(self):
        cases = {
            "special_tokens_map.json": lambda d: _write(os.path.join(d, "special_tokens_map.json"), "{}"),
            "a named class": lambda d: _edit_config(d, tokenizer_class="Qwen2Tokenizer"),
            "space clean-up": lambda d: _edit_config(d, clean_up_tokenization_spaces=True),
            "named templates": lambda d: os.makedirs(os.path.join(d, "additional_chat_templates")),
            "no tokenizer.json": lambda d: os.remove(os.path.join(d, "tokenizer.json")),
            "a special token tokenizer.json lacks": lambda d: _edit_config(
                d, extra_special_tokens=MARKERS + ["<|not_in_the_vocabulary|>"]),
        }
        for why, change in cases.items():
            d = os.path.join(self.dir, "case")
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(self.tools, d)
            change(d)
            self.assertIsNone(light_tokenizer.load(d), why)

    def test_a_trainer_process_does_not_import_transformers_or_torch(self):
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from opforge import tokenizer, chat_tools;"
                "tokenizer.info(json.dumps({'model': sys.argv[2]}));"
                "tokenizer.chat_tokens(json.dumps({'model': sys.argv[2], 'records': [{'messages': "
                "[{'role': 'user', 'content': 'a'}, {'role': 'assistant', 'content': 'b'}]}]}));"
                "chat_tools.pieces(json.dumps({'model': sys.argv[2], 'ids': [1, 2]}));"
                "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code, os.path.join(REPO, "python"), self.tools],
                             capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.strip(), "[]", out.stderr)


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _edit_config(d, **changes):
    p = os.path.join(d, "tokenizer_config.json")
    with open(p) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(p, "w") as f:
        json.dump(cfg, f)


if __name__ == "__main__":
    unittest.main()
