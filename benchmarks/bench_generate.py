"""Generation speed of Llama-style models (random weights): neuron vs CPU eager, measured in the same run.

    python benchmarks/bench_generate.py                      # 100M model, fp32 and bf16
    python benchmarks/bench_generate.py --model both --dtype bfloat16 --batches 1,4,16 --json out.json

Models: "100m" (12 x 768, a 32000-token tied embedding) and "large", sized from the last-level cache measured here
so that its weights in the benchmarked dtype are at least 4x the LLC (~1.1B parameters for a 480 MiB L3 in bf16).
Prefill: tokens/s of one forward pass over a prompt of each --prefills length (batch 1).
Decode: tokens/s (all sequences of the batch) of greedy generation with the static cache, excluding the prefill:
the time from the first generated token to the last, over NEW - 1 steps, taken inside one generate call by a
streamer that waits for the device at each token. (Subtracting a 1-token generation from a NEW-token one, as
before, mixed two static-cache sizes, which are two compiled graphs, and gave no figure at all when the 1-token
call was the slower.)
Bound: a decode step reads every weight once, so it cannot beat batch x read bandwidth / weight bytes, with the
read bandwidth from a read-only probe (benchmarks/machine.py); nor batch x peak / (2 x parameters) when compute
bounds it. The bound holds only for weights several times the LLC: a cache-resident model (the 100M one) reads
its weights from cache, and its decode figures are reported as they are, without a share of a bound.
neuron and CPU alternate repeat by repeat so a phase of the shared host colours both; each figure is the median
of its repeats with their min-max. --compile: static-cache generation as Transformers compiles it by default, on
both sides (backend "neuron" on neuron, Inductor on CPU), so decode is compiled against compiled; prefill is a plain
forward pass, eager on both sides, in either mode.
"""

import argparse
import copy
import math
import statistics
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from _results import Results, add_json_arg, short_by
import machine

DECODE_PROMPT = 32
VOCAB = 32000
# Issue 27's targets.
DECODE_EAGER_SHARE = 0.75
DECODE_COMPILED_SHARE = 0.90
DECODE_B16_VS_CPU = 2.0
PREFILL_512_VS_CPU = 1.2


def config_100m():
    # 12 layers of hidden 768 (MLP 2048, 12 query / 4 key-value heads) + a 32000-token tied embedding: ~100M.
    return LlamaConfig(vocab_size=VOCAB, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                       num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                       tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def config_large(min_weight_bytes, elt):
    """TinyLlama's shape (hidden 2048, MLP 5632, 32 query / 4 key-value heads of 64) with as many layers as it
    takes for the weights to reach min_weight_bytes in elements of elt bytes."""
    h, inter, kvd = 2048, 5632, 4 * 64
    per_layer = 2 * h * h + 2 * h * kvd + 3 * h * inter + 2 * h
    fixed = VOCAB * h + h
    layers = max(1, math.ceil((min_weight_bytes / elt - fixed) / per_layer))
    return LlamaConfig(vocab_size=VOCAB, hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=32, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                       tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def sync(device):
    if device.startswith("neuron"):
        torch.neuron.synchronize()


def once(fn, device):
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


class StepClock:
    """A generate() streamer that stamps each put (the prompt, then every new token) after the device is done."""

    def __init__(self, device):
        self.device, self.stamps = device, []

    def put(self, value):
        sync(self.device)
        self.stamps.append(time.perf_counter())

    def end(self):
        pass

    def decode_seconds(self):
        """Time from the first new token to the last (the decode steps without the prefill)."""
        return self.stamps[-1] - self.stamps[1]


def compile_available():
    try:
        return "neuron" in torch._dynamo.list_backends(exclude_tags=())
    except Exception:
        return False


def alternate(fns, repeats):
    """{device: [seconds per repeat]}, the devices taking turns within each repeat after one untimed call each."""
    for dev, fn in fns.items():
        once(fn, dev)
    out = {dev: [] for dev in fns}
    for _ in range(repeats):
        for dev, fn in fns.items():
            out[dev].append(once(fn, dev))
    return out


def spread(xs):
    return statistics.median(xs), min(xs), max(xs)


def run_model(label, model_cpu, dtype, args, bw, peak, llc, res, rows):
    params = sum(p.numel() for p in model_cpu.parameters())
    elt = torch.empty((), dtype=dtype).element_size()
    weight_bytes = params * elt
    dram_bound = weight_bytes >= 4 * llc
    name = str(dtype).replace("torch.", "")
    # Module.to moves in place: neuron gets a copy, so both devices hold the model for the whole run.
    models = {"neuron": copy.deepcopy(model_cpu).to("neuron"), "cpu": model_cpu}
    compiled = args.compile and compile_available()
    gen = torch.Generator().manual_seed(0)
    group = f"{label} {name}"
    print(f"\n{label} {name}: {params / 1e6:.0f}M parameters, {weight_bytes / 1e9:.2f} GB of weights = "
          f"{weight_bytes / llc if llc else float('nan'):.1f}x the LLC: "
          f"{'DRAM-bound decode' if dram_bound else 'cache-resident, no bandwidth bound'}", flush=True)
    with torch.no_grad():
        for length in args.prefills:
            prompt = torch.randint(3, VOCAB, (1, length), generator=gen)
            ins = {"neuron": prompt.to("neuron"), "cpu": prompt}
            ts = alternate({d: (lambda d=d: models[d](ins[d], use_cache=False)) for d in models}, args.repeats)
            n, c = [tuple(length / t for t in reversed(spread(ts[d])[1:])) for d in ("neuron", "cpu")]
            n_med, c_med = length / spread(ts["neuron"])[0], length / spread(ts["cpu"])[0]
            ratio = n_med / c_med
            tgt = miss = None
            if length == 512:
                tgt, miss = f">= {PREFILL_512_VS_CPU}x CPU", short_by(ratio, PREFILL_512_VS_CPU) or None
            res.add(group, f"prefill {length}", n_med, "tok/s", ref=c_med, ref_name="PyTorch CPU eager", spread=n,
                    ref_spread=c, target=tgt, met=None if tgt is None else not miss, miss=miss, phase="prefill",
                    length=length, model=label, dtype=name, params=params)
            rows.append(f"{group:16s} {'prefill ' + str(length):14s} {n_med:10.1f} ({n[0]:.1f}-{n[1]:.1f}) "
                        f"{c_med:10.1f} {ratio:6.2f}x")
            print(rows[-1], flush=True)
        kwargs = dict(do_sample=False, cache_implementation="static", pad_token_id=0)
        if not compiled:
            kwargs["disable_compile"] = True
        for batch in args.batches:
            short = torch.randint(3, VOCAB, (batch, DECODE_PROMPT), generator=gen)
            ins = {"neuron": short.to("neuron"), "cpu": short}

            clocks = {d: [] for d in models}

            def gen_fn(d):
                def run():
                    clocks[d].append(StepClock(d))
                    models[d].generate(ins[d], max_new_tokens=args.new, min_new_tokens=args.new,
                                       streamer=clocks[d][-1], **kwargs)
                return run
            alternate({d: gen_fn(d) for d in models}, args.repeats)
            # The first call of each device is alternate's untimed warm-up.
            tps = {d: [batch * (args.new - 1) / c.decode_seconds() for c in clocks[d][1:]] for d in models}
            n_med, n_lo, n_hi = spread(tps["neuron"])
            c_med, c_lo, c_hi = spread(tps["cpu"])
            ratio = n_med / c_med
            bound = None
            targets, misses = [], []
            if dram_bound:
                # Memory: every weight once per step; compute: 2 flops per parameter per sequence.
                step = max(weight_bytes / (bw * 1e9), 2.0 * params * batch / (peak * 1e9) if peak else 0.0)
                bound = batch / step
                if batch == 1:
                    want = DECODE_COMPILED_SHARE if compiled else DECODE_EAGER_SHARE
                    targets += [f">= {100 * want:.0f}% of bound", ">= 1.0x CPU"]
                    misses += [short_by(n_med / bound, want), short_by(ratio, 1.0)]
            if batch == 16:
                targets.append(f">= {DECODE_B16_VS_CPU}x CPU")
                misses.append(short_by(ratio, DECODE_B16_VS_CPU))
            miss = "; ".join(m for m in misses if m)
            res.add(group, f"decode batch {batch}", n_med, "tok/s", ref=c_med,
                    ref_name="CPU, Transformers' compiled generation (Inductor)" if compiled else "PyTorch CPU eager",
                    spread=(n_lo, n_hi), ref_spread=(c_lo, c_hi), bound=bound,
                    bound_name="weights / read bandwidth" if bound else None, target=", ".join(targets) or None,
                    met=(not miss) if targets else None, miss=miss or None, phase="decode", batch=batch, model=label,
                    dtype=name, params=params, weight_bytes=weight_bytes, compiled=compiled)
            share = f"  bound {bound:.1f} tok/s, {n_med / bound:.0%} of it" if bound else ""
            rows.append(f"{group:16s} {'decode b' + str(batch):14s} {n_med:10.2f} ({n_lo:.2f}-{n_hi:.2f}) "
                        f"{c_med:10.2f} {ratio:6.2f}x{share}")
            print(rows[-1], flush=True)
    del models


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["100m", "large", "both"], default="100m")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1", help="decode batch sizes, comma-separated")
    parser.add_argument("--prefills", default="512", help="prefill lengths, comma-separated")
    parser.add_argument("--new", type=int, default=128, help="new tokens per decode measurement")
    parser.add_argument("--large-new", type=int, default=None, help="new tokens for the large model (default --new)")
    parser.add_argument("--large-prefills", default=None, help="prefill lengths of the large model (default --prefills)")
    parser.add_argument("--compile", action="store_true", help="neuron's static-cache generation compiled with "
                        "backend neuron (Transformers' default on neuron); default: eager on both devices")
    add_json_arg(parser)
    args = parser.parse_args()
    import torch_neuronx  # noqa: F401

    if args.new < 2 or (args.large_new is not None and args.large_new < 2):
        parser.error("--new and --large-new must be at least 2: decode is timed from the first new token to the last")
    args.batches = [int(x) for x in args.batches.split(",") if x]
    args.prefills = [int(x) for x in args.prefills.split(",") if x]
    transformers.logging.set_verbosity_error()
    m = machine.measure()
    bw, llc = m["read_bw_gbs"], m["llc_bytes"]
    dtypes = [torch.float32, torch.bfloat16] if args.dtype == "both" else [getattr(torch, args.dtype)]
    mode = "torch.compile (neuron)" if args.compile and compile_available() else "eager (disable_compile=True)"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads; "
          f"neuron static cache: {mode}")
    print(f"read bandwidth (read-only probe, {m['read_probe_mib']} MiB): {bw:.1f} GB/s; LLC {llc >> 20} MiB; "
          f"peaks fp32 {m['fp32_peak_gflops']:.0f}, bf16 {m['bf16_peak_gflops']:.0f} GFLOP/s")
    print(f"{'model':16s} {'phase':14s} {'neuron tok/s (min-max)':>24s} {'cpu tok/s':>10s} {'ratio':>7s}")
    res = Results("generate")
    res.meta.update(read_bw_gbs=bw, llc_bytes=llc, compiled=args.compile and compile_available())
    rows = []
    for label in (["100m", "large"] if args.model == "both" else [args.model]):
        for dtype in dtypes:
            elt = torch.empty((), dtype=dtype).element_size()
            torch.manual_seed(0)
            cfg = config_100m() if label == "100m" else config_large(4 * llc, elt)
            saved = args.new, args.prefills
            if label == "large":
                args.new = args.large_new or args.new
                if args.large_prefills is not None:
                    args.prefills = [int(x) for x in args.large_prefills.split(",") if x]
            # Built in the benchmarked dtype: a 1B model's fp32 init alone would take a minute on 2 cores.
            model = LlamaForCausalLM._from_config(cfg, torch_dtype=dtype).eval()
            run_model(label, model, dtype, args, bw, m[f"{'bf16' if elt == 2 else 'fp32'}_peak_gflops"], llc, res,
                      rows)
            args.new, args.prefills = saved
            del model
    res.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
