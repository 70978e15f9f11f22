"""`opforge agent sft`'s parquet read by TRL: `datasets` loads it, TRL's SFTTrainer renders every
record through a tool-aware chat template (tool calls and tool answers included) and trains one
step on CPU. The model is a tiny randomly initialised Qwen2 made from a config; its byte-level
tokenizer is trained here, offline, on the records' own text. Driven by tests/test_agent.cpp.
Prints {"rows", "steps", "rendered"} as JSON; exit 1 when a record is not rendered whole.

  python3 tests/python/sft_check.py RFT.parquet OUT_DIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_fixture import bpe_tokenizer  # noqa: E402


def model(vocab_size):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=4096, pad_token_id=0, eos_token_id=1))


def main(parquet, out_dir):
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    ds = load_dataset("parquet", data_files=parquet, split="train")
    tok = bpe_tokenizer([m["content"] or "" for r in ds for m in r["messages"]] + [r["tools"] for r in ds], 512)
    first = ds[0]
    text = tok.apply_chat_template(first["messages"], tools=json.loads(first["tools"]), tokenize=False)
    calls = [c for m in first["messages"] for c in (m["tool_calls"] or [])]
    whole = all(f"<|call|>{c['function']['name']} {c['function']['arguments']}" in text for c in calls) and \
        all(m["content"] in text for m in first["messages"]) and '"name": "write_file"' in text
    cfg = SFTConfig(output_dir=out_dir, max_steps=1, per_device_train_batch_size=1, max_length=1024,
                    learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                    bf16=False, seed=0, dataloader_num_workers=0)
    trainer = SFTTrainer(model=model(len(tok)), args=cfg, train_dataset=ds, processing_class=tok)
    trainer.train()
    print(json.dumps({"rows": len(ds), "steps": trainer.state.global_step, "rendered": whole,
                      "calls": len(calls)}))
    return 0 if whole and trainer.state.global_step == 1 else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
