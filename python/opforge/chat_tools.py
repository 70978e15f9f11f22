"""Chat prompts with tools for opforge's policy server (trainer/policy_server.cpp, `opforge generate
--serve`): OpenAI chat messages rendered by the model's own chat template through transformers, as
vLLM renders them (opforge.tokenizer._render, the rendering training uses too), and the text of
each sampled token for OpenAI's `logprobs`. Each function takes and returns JSON text; the
tokenizer is opforge.tokenizer's (one per model folder per process)."""
import json

from opforge.tokenizer import _render, _tok


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
    try:
        text = _render(t, messages, tools, True)
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
