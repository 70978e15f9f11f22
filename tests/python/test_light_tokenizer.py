"""opforge.light_tokenizer (what transformers built for a tokenizer folder, reused without
importing transformers) against transformers itself, through opforge.tokenizer's and
opforge.chat_tools' functions: the same ids, texts, chat rows and errors, on tokenizers trained
offline with two chat templates (the SFT fixture's, and one with tools, `tojson`, loop controls, a
generation tag and raise_exception) and folders transformers reads its own way (a qwen2 model's,
split special tokens, padding and truncation saved in tokenizer.json).

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

from chat_fixture import MARKERS, TEMPLATE, bpe_tokenizer  # noqa: E402
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


def _folder(root, name, template, config=None, model_type=None, tokenizer_json=None):
    """A tokenizer folder saved by transformers from an offline-trained BPE, then edited as a
    model's folder may be: tokenizer_config.json keys, a config.json, tokenizer.json fields."""
    tok = bpe_tokenizer(TEXTS, 400, MARKERS)
    tok.chat_template = template
    d = os.path.join(root, name)
    tok.save_pretrained(d)
    if config:
        _edit_config(d, **config)
    if model_type:
        _write(os.path.join(d, "config.json"), json.dumps({"model_type": model_type}))
    if tokenizer_json:
        p = os.path.join(d, "tokenizer.json")
        with open(p) as f:
            tj = json.load(f)
        tj.update(tokenizer_json)
        _write(p, json.dumps(tj))
    return d


class LightTokenizer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.env = {k: os.environ.get(k) for k in ("OPFORGE_TOKENIZER_CACHE", "OPFORGE_TOKENIZER")}
        os.environ["OPFORGE_TOKENIZER_CACHE"] = os.path.join(cls.dir, "cache")
        os.environ.pop("OPFORGE_TOKENIZER", None)
        r = cls.dir
        cls.plain = _folder(r, "plain", TEMPLATE)
        cls.tools = _folder(r, "tools", TOOLS_TEMPLATE)
        cls.folders = {
            "plain": cls.plain, "tools": cls.tools,
            # transformers 5 builds its Qwen2Tokenizer for a qwen2 model whatever the saved class
            # (NFC, Qwen's split): what tests/python/tiny_lm.py and the learning run save.
            "qwen2": _folder(r, "qwen2", TOOLS_TEMPLATE, model_type="qwen2"),
            "split special tokens": _folder(r, "split", TEMPLATE, config={"split_special_tokens": True}),
            "padding and truncation in tokenizer.json": _folder(r, "padded", TEMPLATE, tokenizer_json={
                "padding": {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None,
                            "pad_id": 0, "pad_type_id": 0, "pad_token": "<pad>"},
                "truncation": {"direction": "Right", "max_length": 3, "strategy": "LongestFirst", "stride": 0}}),
        }

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)
        for k, v in cls.env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def both(self, fn, req):
        """fn's reply from transformers (which leaves its tokenizer in the cache), then from the
        cache in a fresh process's state: the light tokenizer, asserted to be the one used."""
        out = []
        for mode in ("transformers", None):
            tokenizer._CACHE.clear()
            if mode:
                os.environ["OPFORGE_TOKENIZER"] = mode
            try:
                out.append(_call(fn, req))
            finally:
                os.environ.pop("OPFORGE_TOKENIZER", None)
        self.assertIsInstance(tokenizer._CACHE[req["model"]], light_tokenizer.LightTokenizer, req["model"])
        tokenizer._CACHE.clear()
        return out[1], out[0]

    def test_info_encode_decode_match_transformers(self):
        texts = TEXTS[:3] + ["<|assistant|>x<eos><pad>", "a<|user|>b", "", "  spaces\n\n\ttabs", "e\u0301 ﬁ ①"]
        for why, d in self.folders.items():
            light, info = self.both(tokenizer.info, {"model": d})
            self.assertEqual(light, info, why)
            for text in texts:
                light, ref = self.both(tokenizer.encode, {"model": d, "text": text})
                self.assertEqual(light, ref, (why, text))
                ids = ref["ids"] + [info["eos_id"], info["pad_id"]]  # special tokens to skip or keep
                for skip in (True, False):
                    light, ref = self.both(tokenizer.decode, {"model": d, "ids": ids, "skip_special": skip})
                    self.assertEqual(light, ref, (why, text, skip))

    def test_chat_rendering_and_sft_rows_match_transformers(self):
        for why, d in self.folders.items():
            for tools in (None, TOOLS):
                req = {"model": d, "messages": CHAT[:1]}
                if tools:
                    req["tools"] = tools
                light, ref = self.both(tokenizer.encode, req)
                self.assertEqual(light, ref, why)
                rec = {"messages": CHAT, "tools": tools} if tools else {"messages": CHAT}
                light, ref = self.both(tokenizer.chat_tokens, {"model": d, "records": [rec], "max_len": 0})
                self.assertEqual(light, ref, why)
                self.assertIn("ids", light["rows"][0])
                srv = {"model": d, "messages": json.dumps(CHAT[:3]), "tools": json.dumps(tools) if tools else None}
                light, ref = self.both(chat_tools.encode, srv)
                self.assertEqual(light, ref, why)

    def test_template_and_tool_errors_are_refused_as_transformers_refuses_them(self):
        bad = [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]
        light, ref = self.both(chat_tools.encode, {"model": self.tools, "messages": json.dumps(bad), "tools": None})
        self.assertIn("system only first", light["error"])
        self.assertEqual(light, ref)
        for tools in ({"name": "run"}, ["run"]):
            light, ref = self.both(chat_tools.encode, {"model": self.tools, "messages": json.dumps(CHAT[:1]),
                                                       "tools": json.dumps(tools)})
            self.assertIn("error", ref)
            self.assertIn("error", light)

    def test_what_is_not_remembered_stays_on_transformers(self):
        cases = {"space clean-up": _folder(self.dir, "cleanup", TEMPLATE, config={"clean_up_tokenization_spaces": True})}
        named = _folder(self.dir, "named", TEMPLATE)
        os.makedirs(os.path.join(named, "additional_chat_templates"))
        _write(os.path.join(named, "additional_chat_templates", "tool_use.jinja"), TOOLS_TEMPLATE)
        cases["named templates"] = named
        # A config that re-adds a special token as an ordinary one: the live backend still skips it
        # when decoding, its serialisation would not (the round trip is checked before keeping it).
        readded = _folder(self.dir, "readded", TEMPLATE)
        with open(os.path.join(readded, "tokenizer.json")) as f:
            added = json.load(f)["added_tokens"]
        flags = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
        _edit_config(readded, added_tokens_decoder={
            str(a["id"]): {**{k: a[k] for k in flags}, **({"special": False} if a["content"] == "<|end|>" else {})}
            for a in added})
        cases["a special token re-added as ordinary"] = readded
        for why, d in cases.items():
            tokenizer._CACHE.clear()
            _call(tokenizer.info, {"model": d})
            self.assertIsNone(light_tokenizer.load(d), why)

    def test_the_cache_follows_the_tokenizer_files_not_the_weights(self):
        d = os.path.join(self.dir, "keyed")
        shutil.copytree(self.plain, d)
        tokenizer._CACHE.clear()
        _call(tokenizer.info, {"model": d})
        self.assertIsNotNone(light_tokenizer.load(d))
        _write(os.path.join(d, "model.safetensors"), "new weights")
        self.assertIsNotNone(light_tokenizer.load(d))
        _edit_config(d, eos_token="<pad>")
        self.assertIsNone(light_tokenizer.load(d))
        os.environ["OPFORGE_TOKENIZER"] = "transformers"
        try:
            _call(tokenizer.info, {"model": self.plain})
            self.assertIsNone(light_tokenizer.load(self.plain))
        finally:
            os.environ.pop("OPFORGE_TOKENIZER")

    def test_a_later_process_imports_neither_transformers_nor_torch(self):
        tokenizer._CACHE.clear()
        _call(tokenizer.info, {"model": self.tools})
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
