"""A model folder's tokenizer as transformers built it, reused without importing transformers
(whose import pulls torch's Python side: 3 s on the CPU machine, 13.8 s of a 1-token
`opforge generate` on an H100, paid by every trainer process).

The first process that loads a folder's tokenizer through transformers writes what transformers
built (`load_or_build`): its `tokenizers` backend serialised as it stands after transformers' loading
(the model's own tokenizer class, added and special tokens, the versioned file it chose), the
chat template, the variables transformers gives the template (its special-tokens map) and the
eos and pad ids. Later processes load that with `tokenizers` and render the template
with jinja2 set up as transformers sets it up, so the ids and text are transformers'. The cache
is keyed by the folder's small files (weights excluded: checkpoints of one tokenizer share it)
and the transformers and tokenizers versions. A tokenizer whose class changes encoding, decoding
or templating beyond that, that cleans up decoded spaces, or that has several named templates is
not remembered: it stays on transformers. tests/python/test_light_tokenizer.py holds the two to
the same ids, text, chat rows and errors; OPFORGE_TOKENIZER=transformers turns the reuse off.
"""
import hashlib
import json
import os
from datetime import datetime

FORMAT = 1
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
BIG = 256 << 20


def _cache_dir():
    """OPFORGE_TOKENIZER_CACHE, else beside the judge's cache (evaluator's default_cache_dir)."""
    d = os.environ.get("OPFORGE_TOKENIZER_CACHE")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return d or os.path.join(base, "opforge", "tokenizers")


def _key(folder):
    """The cache file of `folder`: its files other than weights (names, sizes and contents) and
    the library versions that built and read it. None when the folder cannot be read."""
    import tokenizers

    try:
        import importlib.metadata as md

        tf = md.version("transformers")
    except Exception:  # noqa: BLE001 - no transformers: nothing was or can be remembered
        return None
    h = hashlib.sha256(f"{FORMAT} {tf} {tokenizers.__version__}".encode())
    try:
        # Subfolders too: transformers reads additional_chat_templates/ beside the files.
        for base, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                p = os.path.join(base, name)
                if name.endswith(WEIGHTS) or not os.path.isfile(p):
                    continue
                h.update(os.path.relpath(p, folder).encode() + b"\0")
                st = os.stat(p)
                if st.st_size > BIG:  # not a tokenizer's: its size and time stand for it
                    h.update(f"{st.st_size} {st.st_mtime_ns}".encode())
                    continue
                with open(p, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
    except OSError:
        return None
    return os.path.join(_cache_dir(), h.hexdigest()[:32] + ".json")


def load(folder):
    """The folder's remembered tokenizer, or None (not remembered yet, or the reuse is off)."""
    return _read(_key(folder))


def load_or_build(folder, build):
    """The folder's tokenizer: the remembered one, else `build(folder)` (transformers'), kept for
    later processes when they can reuse it exactly. The folder is hashed once for both."""
    path = _key(folder)
    t = _read(path)
    if t is None:
        t = build(folder)
        _remember(path, t)
    return t


def _read(path):
    if os.environ.get("OPFORGE_TOKENIZER") == "transformers" or path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return LightTokenizer(json.load(f))
    except Exception:  # noqa: BLE001 - a damaged or foreign entry: transformers loads it again
        return None


def _remember(path, t):
    """Keeps what transformers built as `t` at `path`. A cache that cannot be written only costs
    the next process the slow load."""
    entry = _entry(t)
    if entry is None or path is None or not _same(t, LightTokenizer(entry)):
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    except OSError:
        pass


# What transformers' generic fast tokenizer does on the paths opforge uses: these must be the
# class's own, not a model class's override, for the backend alone to give the same result.
_PATH_METHODS = ("encode", "_encode_plus", "decode", "_decode", "apply_chat_template", "get_chat_template",
                 "convert_tokens_to_ids")


def _entry(t):
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    if not isinstance(t, TokenizersBackend) or any(
            getattr(type(t), m, None) is not getattr(TokenizersBackend, m, None) for m in _PATH_METHODS):
        return None
    template = getattr(t, "chat_template", None)
    if getattr(t, "clean_up_tokenization_spaces", False) or not (template is None or isinstance(template, str)):
        return None
    return {"format": FORMAT, "backend": t.backend_tokenizer.to_str(), "chat_template": template,
            "template_kwargs": dict(t.special_tokens_map), "eos_token_id": t.eos_token_id,
            "pad_token_id": t.pad_token_id, "split_special_tokens": bool(getattr(t, "split_special_tokens", False))}


def _same(t, light):
    """The serialised backend read back gives transformers' ids and text for every added token
    and a probe of them in text. `tokenizers` keeps a token once added as special in its special
    set even when a config re-adds it as an ordinary one, and serialises only the last flags."""
    added = sorted(t.backend_tokenizer.get_added_tokens_decoder().items())
    ids = [i for i, _ in added] + list(range(min(t.backend_tokenizer.get_vocab_size(), 64)))
    for skip in (True, False):
        if any(light.decode([i], skip_special_tokens=skip) != t.decode([i], skip_special_tokens=skip) for i in ids):
            return False
        if light.decode(ids, skip_special_tokens=skip) != t.decode(ids, skip_special_tokens=skip):
            return False
    contents = [a.content for _, a in added]
    for probe in (" ".join(contents) + " x y\n", "a".join(contents) + "a", "def f(x): return x + 1"):
        if light.encode(probe) != t.encode(probe, add_special_tokens=False):
            return False
    return True


class LightTokenizer:
    """The subset of transformers' tokenizer that opforge.tokenizer and opforge.chat_tools use."""

    def __init__(self, entry):
        from tokenizers import Tokenizer

        if entry.get("format") != FORMAT:
            raise ValueError("another cache format")
        self._tk = Tokenizer.from_str(entry["backend"])
        # transformers encodes with the backend's padding and truncation off, and its own choice
        # of splitting special tokens.
        self._tk.no_padding()
        self._tk.no_truncation()
        self._tk.encode_special_tokens = entry["split_special_tokens"]
        self.chat_template = entry["chat_template"]
        self._kwargs = entry["template_kwargs"]
        self.eos_token_id, self.pad_token_id = entry["eos_token_id"], entry["pad_token_id"]
        self._compiled = None

    def encode(self, text, add_special_tokens=False):
        return self._tk.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens=True):
        return self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=False):
        """transformers' rendering of one conversation: its checks, its variables."""
        if tokenize:
            raise ValueError("LightTokenizer.apply_chat_template renders text only (tokenize=False)")
        if not self.chat_template:
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")
        if isinstance(messages, (list, tuple)) and not messages:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("a conversation is a list of messages (one conversation, not a batch)")
        if tools is not None and not all(isinstance(x, dict) for x in tools):
            raise ValueError("Tools should either be a JSON schema, or a callable function with type hints "
                             "and a docstring suitable for auto-conversion to a schema.")
        if self._compiled is None:
            self._compiled = _environment().from_string(self.chat_template)
        return self._compiled.render(**self._kwargs, messages=messages, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt)


def _environment():
    """jinja2 as transformers documents it for chat templates: the immutable sandbox, trimmed
    blocks, loop controls, `tojson` without HTML escaping, raise_exception, strftime_now, and the
    `{% generation %}` tag (it marks assistant text for transformers' assistant mask; rendered as is)."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
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
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return GenerationTag
