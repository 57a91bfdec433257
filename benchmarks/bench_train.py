"""Training speed: SFT steps (forward, backward, AdamW step) of a ~100M-parameter Llama-style model at sequence
length 512, in four setups measured in one run: neuron eager, neuron compiled (backend "neuron"), CPU eager
and CPU Inductor. Prints tokens/s, peak memory, the ratios and MFU.

    python benchmarks/bench_train.py                      # ~100M model, seq 512, batch 1, fp32
    python benchmarks/bench_train.py --layers 2 --seq 128 # a quick check

MFU = 6 x parameters x tokens/s over the fp32 FMA peak measured here (torch_neuronx._C._fma_peak_gflops:
a register-only FMA loop on all threads). Pairs are timed with benchmarks/_timing.compare (alternating
rounds, medians, min-max spread), so a slow phase of the host lands on both sides.
Targets (issue 23): eager >= 1.2x CPU eager; compiled >= 1.2x CPU Inductor; compiled >= 40% MFU in fp32.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_neuronx  # noqa: E402
from _results import Results, add_json_arg, short_by  # noqa: E402
from _timing import compare, cpu_name  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402


def make_model(layers, device, dtype):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=layers,
                      num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).to(dtype).to(device).train()


def make_step(model, ids, compiled):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=False)

    def loss_fn(x):
        return model(input_ids=x, labels=x).loss

    fwd_bwd = torch.compile(loss_fn, backend="neuron" if ids.device.type == "neuron" else "inductor") \
        if compiled else loss_fn

    def step():
        loss = fwd_bwd(ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def peak_bytes(device, fn):
    if device == "neuron":
        torch.neuron.reset_peak_memory_stats()
        fn()
        torch.neuron.synchronize()
        return torch.neuron.max_memory_allocated()
    import resource

    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the process's peak RSS (upper bound)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--budget", type=float, default=6.0, help="seconds of timed calls per pair")
    p.add_argument("--rounds", type=int, default=5)
    add_json_arg(p)
    a = p.parse_args()
    res = Results("train")
    dtype = getattr(torch, a.dtype)
    torch._dynamo.config.cache_size_limit = 64
    ids_cpu = torch.randint(3, 32000, (a.batch, a.seq))
    params = sum(t.numel() for t in make_model(a.layers, "cpu", dtype).parameters())
    tokens = a.batch * a.seq
    peak = torch_neuronx._C._fma_peak_gflops()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} threads; GEMM ISA {torch_neuronx._C._gemm_isa()}; "
          f"fp32 FMA peak {peak:.0f} GFLOP/s")
    print(f"model: {params / 1e6:.1f}M parameters, {a.layers} layers, {a.dtype}; batch {a.batch} x seq {a.seq}")
    results = {}
    for compiled in (False, True):
        models = {d: make_model(a.layers, d, dtype) for d in ("neuron", "cpu")}
        steps = {d: make_step(models[d], ids_cpu.to(d), compiled) for d in ("neuron", "cpu")}
        for d in ("neuron", "cpu"):  # compile and warm before timing
            steps[d]()
            steps[d]()
        (tn, tn_lo, tn_hi), (tc, tc_lo, tc_hi) = compare(steps["neuron"], steps["cpu"], budget_s=a.budget,
                                                         rounds=a.rounds, sync=torch.neuron.synchronize,
                                                         spread=True)
        mem_n = peak_bytes("neuron", steps["neuron"])
        name = "compiled" if compiled else "eager"
        results[name] = (tn, tc)
        mfu = 6 * params * tokens / tn / (peak * 1e9) if peak else float("nan")
        want = 1.2 if compiled else None
        miss = short_by(tc / tn, want) if want else ""
        res.add(f"{params / 1e6:.0f}M {a.dtype} {a.batch}x{a.seq}", f"step, {name}", tokens / tn, "tok/s",
                ref=tokens / tc, ref_name="CPU Inductor" if compiled else "PyTorch CPU eager",
                spread=(tokens / tn_hi, tokens / tn_lo), ref_spread=(tokens / tc_hi, tokens / tc_lo),
                bound=peak * 1e9 / (6 * params) if peak else None, bound_name="fp32 peak / 6 x parameters (MFU)",
                target=f">= {want}x CPU Inductor" if want else None, met=(not miss) if want else None,
                miss=miss or None, peak_mib=mem_n / 2**20)
        print(f"{name:8s} neuron {tokens / tn:8.1f} tok/s ({tokens / tn_hi:.1f}-{tokens / tn_lo:.1f}), "
              f"CPU {'Inductor' if compiled else 'eager':8s} {tokens / tc:8.1f} tok/s ({tokens / tc_hi:.1f}-"
              f"{tokens / tc_lo:.1f}): {tc / tn:.2f}x; neuron peak memory {mem_n / 2**20:.0f} MiB; MFU {mfu:.1%}")
        del models, steps
    te, ce = results["eager"]
    tcmp, ccmp = results["compiled"]
    mfu = 6 * params * tokens / tcmp / (peak * 1e9) if peak else float("nan")
    for label, got, target in (("eager vs CPU eager", ce / te, 1.2), ("compiled vs CPU Inductor", ccmp / tcmp, 1.2)):
        verdict = "met" if got >= target else f"missed by {target / got:.2f}x"
        print(f"target {label} >= {target}x: {got:.2f}x, {verdict}")
    verdict = "met" if mfu >= 0.40 else f"missed by {0.40 / mfu:.2f}x"
    print(f"target compiled MFU >= 40%: {mfu:.1%}, {verdict}")
    res.write(a.json)


if __name__ == "__main__":
    main()
