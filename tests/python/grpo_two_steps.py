"""TRL's GRPOTrainer for two steps on the CPU, rewarded by opforge through opforge_rl.trl: driven
by tests/test_serve.cpp against its running `opforge serve`. The policy is a tiny randomly
initialised Qwen2 made from a config, its tokenizer built here offline from a small vocabulary
(no download); its completions hold no fenced code, so every one is judged -1 (a real evaluation
of an empty solution, then the verdict cache). Prints the rewards TRL logged as JSON.

  python3 tests/python/grpo_two_steps.py URL TASK OUT_DIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))

from opforge_rl import Client  # noqa: E402
from opforge_rl.trl import make_reward_func  # noqa: E402

# Words only: no backtick, so a random completion never opens a code fence.
WORDS = ["write", "a", "kernel", "for", "the", "model", "fuse", "linear", "relu", "fast", "cuda", "torch",
         "class", "def", "return", "x", "y", "=", "(", ")", ":", "+", "*", "."]


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def model(vocab_size):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return Qwen2ForCausalLM(cfg)


def main(url, task, out_dir):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = tokenizer()
    ds = Dataset.from_dict({"prompt": ["write a kernel for the model", "fuse linear relu for cuda"] * 2,
                            "task_id": [task] * 4})
    cfg = GRPOConfig(output_dir=out_dir, max_steps=2, per_device_train_batch_size=2, num_generations=2,
                     max_completion_length=12, learning_rate=1e-4, logging_steps=1, save_strategy="no",
                     report_to=[], use_cpu=True, bf16=False, seed=0, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model(len(tok)), reward_funcs=[make_reward_func(Client(url, retry_s=30))],
                          args=cfg, train_dataset=ds, processing_class=tok)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h]
    print(json.dumps({"steps": trainer.state.global_step, "rewards": [h["reward"] for h in logged]}))
    return 0 if trainer.state.global_step == 2 and logged else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
