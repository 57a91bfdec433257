"""Builds what examples/sft_neuron_example.py needs, without network: a tiny random Qwen3 causal LM with a
locally trained byte-level BPE tokenizer (Qwen's chat template and special tokens), and a tiny
UltraChat-like dataset directory (`messages` and a string `prompt` column, split `train_sft`).

    python examples/make_tiny_sft.py /tmp/tiny-sft
    # -> /tmp/tiny-sft/model   (AutoModelForCausalLM.from_pretrained / --model_name_or_path)
    #    /tmp/tiny-sft/data    (load_dataset(path, split="train_sft") / --dataset_name)

The model is sized for tensor parallelism up to 4 ranks (4 attention heads, 4 KV heads, vocabulary 512).
"""

import argparse
import json
import os
import random

import torch

_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen's chat template, text only.
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_WORDS = (
    "the a an neuron core tensor model train step loss gradient weight shard rank device memory cache graph "
    "compile kernel batch token sequence layer head attention vector matrix sum product learn rate warm "
    "chat user assistant question answer why how what when where which small large fast slow good data "
    "sun moon river mountain city garden book music paint cook travel story friend morning evening"
).split()


def _sentence(rng: random.Random, lo: int, hi: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize() + rng.choice([".", "?", "!"])


def make_conversations(n: int, seed: int = 0):
    """UltraChat-like rows: prompt (string), prompt_id, messages (alternating user/assistant turns)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        messages = []
        for _ in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": _sentence(rng, 4, 14)})
            messages.append({"role": "assistant", "content": " ".join(_sentence(rng, 5, 16)
                                                                    for _ in range(rng.randint(1, 3)))})
        rows.append({"prompt": messages[0]["content"], "prompt_id": f"{i:08x}", "messages": messages})
    return rows


def make_tokenizer(corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=512, min_frequency=1, special_tokens=_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  extra_special_tokens=["<|im_start|>"], model_max_length=32768,
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = _CHAT_TEMPLATE
    return tok


def make_model(tok, seed: int = 0, hidden: int = 64, layers: int = 2):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=hidden // 4,
                      max_position_embeddings=1024, tie_word_embeddings=False,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).eval()


def make(path: str, rows: int = 256, seed: int = 0) -> dict:
    """Writes <path>/model and <path>/data; returns both paths."""
    conversations = make_conversations(rows, seed)
    corpus = [m["content"] for c in conversations for m in c["messages"]]
    tok = make_tokenizer(corpus)
    model = make_model(tok, seed)
    model_dir, data_dir = os.path.join(path, "model"), os.path.join(path, "data")
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)

    os.makedirs(os.path.join(data_dir, "data"), exist_ok=True)
    with open(os.path.join(data_dir, "data", "train_sft.jsonl"), "w") as f:
        for row in conversations:
            f.write(json.dumps(row) + "\n")
    with open(os.path.join(data_dir, "README.md"), "w") as f:
        f.write("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train_sft\n"
                "    path: data/train_sft.jsonl\n---\n\nA tiny UltraChat-like dataset of random sentences.\n")
    return {"model": model_dir, "data": data_dir}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = make(a.path, a.rows, a.seed)
    print(f"model: {out['model']}\ndataset: {out['data']}")


if __name__ == "__main__":
    main()
