"""The tokenizer of a model folder, for opforge's trainer (trainer/tokenizer.h calls these through
the embedded interpreter). transformers' own tokenizer and chat template, so opforge's token ids
are the ones transformers (and vLLM) would make. What transformers built for a folder is reused by
later processes without importing transformers and torch (opforge.light_tokenizer). Each function
takes and returns JSON text."""
import json
import re

from opforge import light_tokenizer

_CACHE = {}


def _transformers(model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def _tok(model):
    if model not in _CACHE:
        _CACHE[model] = light_tokenizer.load_or_build(model, _transformers)
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
        text = _render(t, req["messages"], req.get("tools"), True)
        return json.dumps({"ids": t.encode(text, add_special_tokens=False)})
    return json.dumps({"ids": t.encode(req["text"], add_special_tokens=False)})


def decode(arg):
    """{model, ids, skip_special?} -> {text}"""
    req = json.loads(arg)
    t = _tok(req["model"])
    return json.dumps({"text": t.decode(req["ids"], skip_special_tokens=req.get("skip_special", True))})


# Templates that print a call's arguments with `tojson` (Qwen2.5, Hermes, Llama 3.1, Mistral) want
# them as a dict, as transformers documents; OpenAI clients send them as JSON text, which such a
# template would print a second time as a quoted string. vLLM turns the text into a dict for every
# template; opforge does so only for these, and gives any other template JSON text (a dict would
# print as Python's repr), so a template that prints the arguments as they come
# (tests/python/chat_fixture.py's) prints the JSON the model wrote. One rendering for training
# (chat_tokens) and serving (chat_tools), so a policy is trained on the prompts it is served.
_TOJSON_ARGUMENTS = re.compile(r"arguments\s*\|\s*tojson")


def _arguments(args, as_object):
    if as_object and isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            return args
        return parsed if isinstance(parsed, dict) else args
    if not as_object and not isinstance(args, str):
        return json.dumps(args, ensure_ascii=False)
    return args


def _with_arguments(message, as_object):
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for c in calls:
        fn = dict(c.get("function") or {})
        if "arguments" in fn:
            fn["arguments"] = _arguments(fn["arguments"], as_object)
        out.append({**c, "function": fn})
    return {**message, "tool_calls": out}


def _render(t, messages, tools, gen_prompt):
    template = getattr(t, "chat_template", None) or ""
    as_object = bool(_TOJSON_ARGUMENTS.search(template if isinstance(template, str) else json.dumps(template)))
    messages = [_with_arguments(m, as_object) for m in messages]
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
