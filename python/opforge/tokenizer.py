"""The tokenizer of a model folder, for opforge's trainer (trainer/tokenizer.h calls these through
the embedded interpreter). transformers' own tokenizer and chat template, so opforge's token ids
are the ones transformers (and vLLM) would make. Each function takes and returns JSON text."""
import json

_CACHE = {}


def _tok(model):
    if model not in _CACHE:
        from transformers import AutoTokenizer

        _CACHE[model] = AutoTokenizer.from_pretrained(model)
    return _CACHE[model]


def info(arg):
    """{model} -> {eos_id, pad_id, has_chat_template}"""
    t = _tok(json.loads(arg)["model"])
    return json.dumps({"eos_id": t.eos_token_id, "pad_id": t.pad_token_id,
                       "has_chat_template": bool(getattr(t, "chat_template", None))})


def encode(arg):
    """{model, text | messages, tools?} -> {ids}. `messages` (OpenAI chat messages) go through the
    model's chat template with the generation prompt added; `text` is tokenized as it is."""
    req = json.loads(arg)
    t = _tok(req["model"])
    if "messages" in req:
        if not getattr(t, "chat_template", None):
            raise ValueError(f"{req['model']}: the tokenizer has no chat template (give --prompt raw text instead)")
        text = t.apply_chat_template(req["messages"], tools=req.get("tools"), add_generation_prompt=True,
                                     tokenize=False)
        return json.dumps({"ids": t.encode(text, add_special_tokens=False)})
    return json.dumps({"ids": t.encode(req["text"], add_special_tokens=False)})


def decode(arg):
    """{model, ids, skip_special?} -> {text}"""
    req = json.loads(arg)
    t = _tok(req["model"])
    return json.dumps({"text": t.decode(req["ids"], skip_special_tokens=req.get("skip_special", True))})
