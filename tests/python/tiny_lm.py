"""Tiny randomly initialised Hugging Face causal LMs, made offline, and transformers' own figures
for them: what tests/test_trainer.cpp holds opforge's libtorch model to.

  python tiny_lm.py make DIR    DIR/qwen2 and DIR/llama (config, safetensors, a BPE tokenizer with a
                                chat template) and DIR/<name>/reference.safetensors, reference.json
  python tiny_lm.py check A B   the logits of folders A and B, loaded by transformers, must be
                                identical (a checkpoint opforge saved against its source)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_fixture import MARKERS, bpe_tokenizer  # noqa: E402

TEXTS = ["def forward(self, x): return torch.relu(x) + 1", "the kernel writes its output once per element",
         "__global__ void add(float* a, const float* b, int n) { a[i] += b[i]; }"] * 20
PROMPT = "def forward(self, x):"
CONFIGS = {
    # Qwen2: q/k/v bias, grouped-query attention (4 heads over 2 kv heads), untied embeddings.
    "qwen2": ("Qwen2Config", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, tie_word_embeddings=False)),
    # Llama: no bias, tied embeddings, explicit head_dim, another rope theta.
    "llama": ("LlamaConfig", dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=3,
                                  num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
                                  rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
}


def _model(name, tok):
    import transformers
    from transformers import AutoModelForCausalLM

    cls, kw = CONFIGS[name]
    # A wide initialiser: logits far apart, so greedy decoding has no near-ties that float32
    # rounding could flip between two correct implementations.
    cfg = getattr(transformers, cls)(vocab_size=len(tok), max_position_embeddings=8192, initializer_range=0.3,
                                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                     bos_token_id=None, **kw)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


def _references(model, tok):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, len(tok), (3, 11), generator=g)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        # Left padding: two prompts of 7 and 11 tokens, positions counted over real tokens.
        mask = torch.ones(2, 11, dtype=torch.long)
        mask[0, :4] = 0
        pos = (mask.cumsum(1) - 1).clamp_min(0)
        padded = model(input_ids=ids[:2], attention_mask=mask, position_ids=pos).logits
        prompt = tok(PROMPT, add_special_tokens=False, return_tensors="pt").input_ids
        greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False,
                                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, prompt.shape[1]:]
    tensors = {"ids": ids, "logits": logits, "padded_mask": mask, "padded_logits": padded}
    return tensors, {"prompt": PROMPT, "prompt_ids": prompt[0].tolist(), "greedy_ids": greedy.tolist()}


def make(root):
    from safetensors.torch import save_file

    tok = bpe_tokenizer(TEXTS, 300, MARKERS)
    for name in CONFIGS:
        d = os.path.join(root, name)
        model = _model(name, tok)
        model.save_pretrained(d)
        tok.save_pretrained(d)
        tensors, meta = _references(model, tok)
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "reference.safetensors"))
        with open(os.path.join(d, "reference.json"), "w") as f:
            json.dump(meta, f)


def check(a, b):
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(2))
    out = []
    for d in (a, b):
        m = AutoModelForCausalLM.from_pretrained(d).eval()
        with torch.no_grad():
            out.append(m(input_ids=ids).logits)
    diff = (out[0] - out[1]).abs().max().item()
    print(json.dumps({"max_abs_diff": diff}))
    return 0 if diff == 0 else 1


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
