"""Greedy text generation with a Hugging Face model on a Neuron device, compared with the CPU.

    python examples/generate.py                    # neuron vs. cpu
    python examples/generate.py --dtype bfloat16
    python examples/generate.py --device cpu       # cpu vs. cpu (no Neuron device needed)

The model is a small Llama-style model (3.3M parameters) built locally, no download:
it is fitted in a few seconds to a short built-in text, which it then recites.
"""

import argparse
import os
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from torch_neuronx.testing.tiny_models import make_demo_model

PROMPT = "The future of AI is"


def generate(model_dir, device, dtype, max_new_tokens, cache):
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=device, dtype=dtype)
    tok = AutoTokenizer.from_pretrained(model_dir)
    # In transformers 5 this returns a BatchEncoding (input_ids and attention_mask).
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, return_tensors="pt"
    ).to(device)
    # disable_compile: a static cache would make generate() call torch.compile; this demo shows eager mode.
    kwargs = dict(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                  cache_implementation=cache, disable_compile=True)

    model.generate(**inputs, **kwargs)  # warm-up
    start = time.perf_counter()
    out = model.generate(**inputs, **kwargs).cpu()  # .cpu() waits for the device to finish
    elapsed = time.perf_counter() - start

    new_ids = out[0, inputs["input_ids"].shape[1]:]
    return new_ids, tok.decode(new_ids, skip_special_tokens=True), len(new_ids) / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="neuron", help="device to run on, compared with cpu (default: neuron)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--cache", default="dynamic", choices=["static", "dynamic"], help="KV cache (default: dynamic)")
    parser.add_argument("--model-dir", help="load the demo model from here (it is created there if missing)")
    args = parser.parse_args()

    if args.device.startswith("neuron"):
        import torch_neuronx  # noqa: F401  registers the "neuron" device (no-op if torch already loaded it)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    dtype = getattr(torch, args.dtype)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or tmp
        if not os.path.exists(os.path.join(model_dir, "config.json")):
            print("Building the demo model...")
            make_demo_model(model_dir)

        print(f'Prompt: "{PROMPT}" (chat template) | greedy, {args.max_new_tokens} new tokens, '
              f"{args.dtype}, {args.cache} KV cache\n")
        runs = []
        for device in (args.device, "cpu"):
            ids, text, tokens_per_s = generate(model_dir, device, dtype, args.max_new_tokens, args.cache)
            runs.append((ids, tokens_per_s))
            print(f"[{device}] {tokens_per_s:.1f} tokens/s")
            print(textwrap.fill(text, width=88, initial_indent="    ", subsequent_indent="    ") + "\n")

    (ids, tokens_per_s), (cpu_ids, cpu_tokens_per_s) = runs
    print(f"Token ids identical: {'yes' if torch.equal(ids, cpu_ids) else 'NO'}")
    print(f"Speed {args.device} / cpu: {tokens_per_s / cpu_tokens_per_s:.2f}x")


if __name__ == "__main__":
    main()
