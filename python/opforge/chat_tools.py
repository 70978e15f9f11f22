"""Chat prompts with tools for opforge's policy server (trainer/policy_server.cpp, `opforge generate
--serve`): OpenAI chat messages rendered by the model's own chat template through transformers, as
vLLM renders them, and the text of each sampled token for OpenAI's `logprobs`. Each function takes
and returns JSON text; the tokenizer is opforge.tokenizer's (one per model folder per process)."""
import json
import re

from opforge.tokenizer import _tok

# Templates that print a call's arguments with `tojson` (Qwen2.5, Hermes, Llama 3.1, Mistral) want
# them as a dict, as transformers documents; OpenAI clients send them as JSON text, which such a
# template would print a second time as a quoted string. vLLM turns the text into a dict for every
# template; opforge does so only for these, and gives any other template JSON text (a dict would
# print as Python's repr), so a template that prints the arguments as they come
# (tests/python/chat_fixture.py's) prints the JSON the model wrote.
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


def encode(arg):
    """{model, messages: JSON text, tools: JSON text or null} -> {ids} | {error}. The messages and
    tools come as JSON text so that their keys keep the order the client sent (the template prints
    tool schemas with `tojson`, key order included). A conversation the template refuses (roles out
    of order, a field it needs missing) is an {error} naming the template's complaint: the request's
    fault, not the server's."""
    req = json.loads(arg)
    t = _tok(req["model"])
    template = getattr(t, "chat_template", None)
    if not template:
        return json.dumps({"error": f"{req['model']}: the tokenizer has no chat template, so chat messages "
                                    "cannot be rendered"})
    messages = json.loads(req["messages"])
    tools = json.loads(req["tools"]) if req.get("tools") else None
    as_object = bool(_TOJSON_ARGUMENTS.search(template if isinstance(template, str) else json.dumps(template)))
    messages = [_with_arguments(m, as_object) for m in messages]
    try:
        text = t.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # jinja2's TemplateError, raise_exception(), a KeyError or TypeError inside it
        return json.dumps({"error": f"the model's chat template cannot render these messages: "
                                    f"{type(e).__name__}: {e}"})
    return json.dumps({"ids": t.encode(text, add_special_tokens=False)})


def pieces(arg):
    """{model, ids} -> {pieces}: each token decoded alone, special tokens included (OpenAI's
    `logprobs.content[].token`). A token holding part of a UTF-8 character decodes to U+FFFD."""
    req = json.loads(arg)
    t = _tok(req["model"])
    return json.dumps({"pieces": [t.decode([i], skip_special_tokens=False) for i in req["ids"]]})
