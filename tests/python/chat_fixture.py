"""What the SFT checks share (tests/python/sft_check.py with TRL, tests/ecosystem/verl_check.py with
verl): a tool-aware chat template and a byte-level BPE tokenizer trained offline on given text."""

MARKERS = ["<|tools|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|call|>", "<|end|>"]
# Every role, the offered tools and the calls with their arguments: what the SFT set must teach.
TEMPLATE = (
    "{%- if tools %}<|tools|>{{ tools | tojson }}<|end|>\n{% endif %}"
    "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<|call|>{{ c.function.name }} {{ c.function.arguments }}"
    "{% endfor %}{% endif %}<|end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}")


def bpe_tokenizer(texts, vocab_size, markers=()):
    """A byte-level BPE trained on `texts`, with TEMPLATE; `markers` become special tokens (whole,
    so a turn tokenizes alone as it does in context)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size,
                                                       special_tokens=["<pad>", "<eos>", "<unk>"] + list(markers),
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    extra = {"additional_special_tokens": list(markers)} if markers else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   **extra)
    fast.chat_template = TEMPLATE
    return fast
