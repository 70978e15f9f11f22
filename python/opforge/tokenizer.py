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


def _render(t, messages, tools, gen_prompt):
    return t.apply_chat_template(messages, tools=tools, add_generation_prompt=gen_prompt, tokenize=False)


def chat_tokens(arg):
    """{model, records: [{messages, tools?}], max_len} -> {rows: [{ids, mask} | {error}]}: each
    chat record rendered by the model's template one message at a time, so that the tokens an
    assistant turn added (after its generation prompt) are marked 1 and everything else 0 — the
    loss mask of SFT. Segments are tokenized apart: the ids are what generation after the prompt
    produces. A record whose template is not prefix-stable, or that has no assistant token, is an
    error row (the trainer counts and skips it)."""
    req = json.loads(arg)
    t = _tok(req["model"])
    return json.dumps({"rows": [_chat_row(t, r, req.get("max_len", 0)) for r in req["records"]]})


def _chat_row(t, record, max_len):
    messages, tools = record.get("messages"), record.get("tools")
    if isinstance(tools, str):  # agent sft writes tools as JSON text (TRL reads it so)
        tools = json.loads(tools)
    if not isinstance(messages, list) or not messages:
        return {"error": "no messages"}
    ids, mask, done = [], [], ""
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            head = _render(t, messages[:i], tools, True) if i else ""
            if not head.startswith(done):
                return {"error": f"the chat template is not prefix-stable at message {i}"}
            ids += t.encode(head[len(done):], add_special_tokens=False)
            mask += [0] * (len(ids) - len(mask))
            done = head
        text = _render(t, messages[:i + 1], tools, False)
        if not text.startswith(done):
            return {"error": f"the chat template is not prefix-stable at message {i}"}
        piece = t.encode(text[len(done):], add_special_tokens=False)
        ids += piece
        mask += [1 if m.get("role") == "assistant" else 0] * len(piece)
        done = text
    if max_len:
        ids, mask = ids[:max_len], mask[:max_len]
    if not any(mask):
        return {"error": "no assistant token (within max_len)"}
    return {"ids": ids, "mask": mask}
