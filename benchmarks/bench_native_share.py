"""Share of ATen operator calls that run a native neuron kernel, for a tiny Llama's typical workloads.

    python benchmarks/bench_native_share.py            # every workload, then the total
    python benchmarks/bench_native_share.py --top 20 --only train,greedy-dynamic

Workloads (eager, float32): one forward+backward with labels (training step without the optimizer),
and `generate` with the dynamic and the static cache, greedy and sampling (top-k + top-p + temperature).
Counts come from torch_neuronx.op_counts(): a call is native when it entered a registered neuron kernel,
fallback when PyTorch's CPU kernel ran on device memory (the zero-copy fallback, or a CPU kernel called
in place of a missing neuron one such as convolution). A native kernel that itself declines an input and
calls the CPU kernel still counts as native here. Static-cache generation runs eagerly
(disable_compile=True): compiled graphs do not dispatch operator by operator.
"""

import argparse
import collections
import sys

import torch

import torch_neuronx
from torch_neuronx.testing.tiny_models import make_tiny_llama

TARGET = 0.95


def workloads(model, tok):
    device = "neuron"
    prompts = ["The future of AI is", "A language model reads text as"]
    enc = tok(prompts, return_tensors="pt", padding=True).to(device)
    gen = dict(max_new_tokens=12, min_new_tokens=12, pad_token_id=tok.pad_token_id)
    sample = dict(do_sample=True, top_k=20, top_p=0.9, temperature=0.8)

    def train():
        model.train()
        batch = tok(prompts, return_tensors="pt", padding=True).to(device)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        model(**batch, labels=labels).loss.backward()
        model.zero_grad(set_to_none=True)
        model.eval()

    def generate(cache, do_sample):
        def run():
            torch.manual_seed(0)
            kw = dict(gen, **(sample if do_sample else dict(do_sample=False)))
            if cache == "static":
                kw.update(cache_implementation="static", disable_compile=True)
            with torch.no_grad():
                model.generate(**enc, **kw)
        return run

    return {
        "train": train,
        "greedy-dynamic": generate("dynamic", False),
        "greedy-static": generate("static", False),
        "sample-dynamic": generate("dynamic", True),
        "sample-static": generate("static", True),
    }


def measure(fn):
    fn()  # warm-up: one-time calls (cache set-up, lazy init) are not what a steady state looks like
    torch_neuronx.reset_op_counts()
    fn()
    return {op: (c["native"], c["fallback"]) for op, c in torch_neuronx.op_counts().items()}


def share(counts):
    native = sum(n for n, _ in counts.values())
    fallback = sum(f for _, f in counts.values())
    total = native + fallback
    return native, fallback, (native / total if total else 1.0)


def report(name, counts, top):
    native, fallback, frac = share(counts)
    print(f"{name:16s} native {native:7d}  fallback {fallback:6d}  native share {100 * frac:6.2f}%")
    falls = sorted(((f, op) for op, (_, f) in counts.items() if f), reverse=True)[:top]
    for f, op in falls:
        print(f"    {f:6d}  {op}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--top", type=int, default=12, help="fallback operators listed per workload")
    p.add_argument("--only", default="", help="comma-separated workload names")
    args = p.parse_args()

    model, tok = make_tiny_llama(seed=0)
    model.to("neuron")
    runs = workloads(model, tok)
    only = [w for w in args.only.split(",") if w]
    total = collections.Counter()
    total_f = collections.Counter()
    for name, fn in runs.items():
        if only and name not in only:
            continue
        counts = measure(fn)
        report(name, counts, args.top)
        for op, (n, f) in counts.items():
            total[op] += n
            total_f[op] += f
    all_counts = {op: (total[op], total_f[op]) for op in set(total) | set(total_f)}
    print()
    report("all", all_counts, args.top)
    frac = share(all_counts)[2]
    print(f"target >= {100 * TARGET:.0f}%: {'met' if frac >= TARGET else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
