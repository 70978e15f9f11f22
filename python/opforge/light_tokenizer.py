"""A model folder's tokenizer without importing transformers (which imports torch: 5-14 s at the
start of every trainer process, most of `opforge generate`'s time to a first token).

Only for folders where transformers itself does nothing but run `tokenizer.json` and render the
chat template: the generic fast classes, one chat template, no legacy special-tokens file, no
clean-up of decoded spaces. Anything else returns None from `load` and the caller uses
transformers. The jinja environment is set up as transformers documents for chat templates
(trimmed blocks, the sandbox, `loopcontrols`, `tojson` without HTML escaping, `raise_exception`,
`strftime_now`) and gets the named special tokens as transformers passes them; the
tests (tests/python/test_light_tokenizer.py) hold it to transformers token for token.
"""
import json
import os
from datetime import datetime

# Classes that are tokenizer.json as it is (transformers 5 writes TokenizersBackend for a
# tokenizer made from a `tokenizers` object; 4.x wrote PreTrainedTokenizerFast).
GENERIC_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}
NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _content(v):
    return v.get("content") if isinstance(v, dict) else v


def _template(folder, cfg):
    """The folder's single chat template (chat_template.jinja first, as transformers 5 saves it),
    '' when it has none, None when it has several (named templates: transformers picks)."""
    if os.path.isdir(os.path.join(folder, "additional_chat_templates")):
        return None
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    if os.path.isfile(os.path.join(folder, "chat_template.json")):
        return None
    t = cfg.get("chat_template")
    if t is None:
        return ""
    return t if isinstance(t, str) else None


def load(folder):
    """A LightTokenizer for `folder`, or None where transformers' own class is needed."""
    if os.environ.get("OPFORGE_TOKENIZER") == "transformers":
        return None
    cfg_path, tj = os.path.join(folder, "tokenizer_config.json"), os.path.join(folder, "tokenizer.json")
    if not (os.path.isfile(cfg_path) and os.path.isfile(tj)) or os.path.isfile(
            os.path.join(folder, "special_tokens_map.json")):
        return None
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    template = _template(folder, cfg)
    if cfg.get("tokenizer_class") not in GENERIC_CLASSES or cfg.get("clean_up_tokenization_spaces") or template is None:
        return None
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(tj)
    # transformers adds the config's added tokens to the backend when they are missing from it;
    # a folder where that would change the vocabulary is left to transformers.
    for idx, tok in (cfg.get("added_tokens_decoder") or {}).items():
        if tk.token_to_id(_content(tok)) != int(idx):
            return None
    special = {k: _content(cfg[k]) for k in NAMED_SPECIAL if _content(cfg.get(k))}
    extra = cfg.get("extra_special_tokens") or cfg.get("additional_special_tokens") or []
    extra = [_content(t) for t in (extra.values() if isinstance(extra, dict) else extra)]
    if any(tk.token_to_id(v) is None for v in list(special.values()) + extra):
        return None  # transformers would add it to the vocabulary
    if tk.get_vocab_size() > 100000:
        return None  # transformers may patch the pre-tokenizer of such a vocabulary (Mistral's regex)
    return LightTokenizer(tk, special, template)


class LightTokenizer:
    """The subset of transformers' tokenizer that opforge.tokenizer uses."""

    def __init__(self, tk, special, template):
        self._tk, self._special = tk, special
        self.chat_template = template or None
        self.eos_token_id = tk.token_to_id(special["eos_token"]) if "eos_token" in special else None
        self.pad_token_id = tk.token_to_id(special["pad_token"]) if "pad_token" in special else None
        self._compiled = None

    def encode(self, text, add_special_tokens=False):
        return self._tk.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens=True):
        return self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=False):
        if tokenize:
            raise ValueError("LightTokenizer.apply_chat_template renders text only (tokenize=False)")
        if not messages:  # as transformers
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        if self._compiled is None:
            self._compiled = _environment().from_string(self.chat_template)
        return self._compiled.render(**self._special, messages=messages, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt)


def _environment():
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters; chat templates want the JSON as it is.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols, _generation_tag()])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _generation_tag():
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        """`{% generation %}...{% endgeneration %}` (templates that mark assistant text for
        transformers' assistant mask) renders its body unchanged."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return GenerationTag
