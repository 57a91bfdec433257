"""Generation speed of a ~100M-parameter Llama-style model (random weights): neuron eager vs CPU eager.

    python benchmarks/bench_generate.py            # fp32 and bf16
    python benchmarks/bench_generate.py --dtype bfloat16 --repeats 3

Prefill: tokens/s of one forward pass over a 512-token prompt (batch 1).
Decode: tokens/s of greedy generation of 128 new tokens with the static cache (batch 1), excluding the prefill.
Ceiling: decoding reads every weight once per token, so it cannot beat (memory bandwidth / weight bytes);
the bandwidth is measured here with a large device-to-device copy (read + write bytes / time).
Static-cache generation runs eagerly on both devices (--compile: neuron compiled with backend "neuron",
as Transformers does by default); the printout says which.
"""

import argparse
import statistics
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT = 512
NEW = 128
DECODE_PROMPT = 32


def config():
    # 12 layers of hidden 768 (MLP 2048, 12 query / 4 key-value heads) + a 32000-token tied embedding: ~100M.
    return LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                       num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024,
                       tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def sync(device):
    if device.startswith("neuron"):
        torch.neuron.synchronize()


def timed(fn, device, repeats):
    fn()  # warm-up
    sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def copy_bandwidth(device, nbytes=256 << 20, repeats=5):
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), device, repeats)
    return 2 * nbytes / t  # read + write


def compile_available():
    try:
        return "neuron" in torch._dynamo.list_backends(exclude_tags=())
    except Exception:
        return False


def bench(model_cpu, device, dtype, repeats, compiled=False):
    model = model_cpu.to(dtype=dtype) if device == "cpu" else model_cpu.to(dtype=dtype).to(device)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 32000, (1, PROMPT), generator=gen).to(device)
    short = torch.randint(3, 32000, (1, DECODE_PROMPT), generator=gen).to(device)
    kwargs = dict(do_sample=False, cache_implementation="static", pad_token_id=0)
    if not (compiled and device.startswith("neuron") and compile_available()):
        kwargs["disable_compile"] = True  # eager vs eager unless --compile

    with torch.no_grad():
        t_prefill = timed(lambda: model(prompt, use_cache=False), device, repeats)
        t_one = timed(lambda: model.generate(short, max_new_tokens=1, min_new_tokens=1, **kwargs), device, repeats)
        t_all = timed(lambda: model.generate(short, max_new_tokens=NEW, min_new_tokens=NEW, **kwargs), device, repeats)
    model.to("cpu")
    return PROMPT / t_prefill, (NEW - 1) / max(t_all - t_one, 1e-9)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="neuron's static-cache generation compiled with "
                        "backend neuron (Transformers' default on neuron); default: eager on both devices")
    args = parser.parse_args()
    import torch_neuronx  # noqa: F401

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = LlamaForCausalLM(config()).eval()
    params = sum(p.numel() for p in model.parameters())
    dtypes = [torch.float32, torch.bfloat16] if args.dtype == "both" else [getattr(torch, args.dtype)]
    mode = "torch.compile (neuron)" if args.compile and compile_available() else "eager (disable_compile=True)"
    print(f"Llama-style model: {params / 1e6:.1f}M parameters; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} threads; neuron static cache: {mode}")
    bw = {d: copy_bandwidth(d) for d in ("cpu", "neuron")}
    print(f"copy bandwidth: cpu {bw['cpu'] / 1e9:.1f} GB/s, neuron {bw['neuron'] / 1e9:.1f} GB/s (read + write)")
    print(f"\n{'dtype':9s} {'phase':8s} {'neuron tok/s':>13s} {'cpu tok/s':>10s} {'neuron/cpu':>10s}  decode ceiling")
    for dtype in dtypes:
        weight_bytes = params * torch.empty((), dtype=dtype).element_size()
        n_pre, n_dec = bench(model, "neuron", dtype, args.repeats, compiled=args.compile)
        c_pre, c_dec = bench(model, "cpu", dtype, args.repeats)
        name = str(dtype).replace("torch.", "")
        print(f"{name:9s} {'prefill':8s} {n_pre:13.1f} {c_pre:10.1f} {n_pre / c_pre:10.2f}")
        ceiling = bw["neuron"] / weight_bytes
        print(f"{name:9s} {'decode':8s} {n_dec:13.2f} {c_dec:10.2f} {n_dec / c_dec:10.2f}  "
              f"{ceiling:.1f} tok/s ({weight_bytes / 1e6:.0f} MB/token): neuron at {n_dec / ceiling:.1%}")
        model.to(torch.float32)
    return 0


if __name__ == "__main__":
    sys.exit(main())
