"""Element-wise ops on neuron vs PyTorch CPU, measured in the same run.

Prints, for add/mul/silu on 1M elements (float32 and bfloat16) and the float32<->bfloat16 casts, the
median time on neuron and on CPU and the ratio CPU/neuron (>= 1 means neuron is as fast or faster).
Then the eager overhead of a tiny op (add of 1 and of 16 elements, out-of-place: dispatch, allocation, launch),
target (issue 27) <= 1.2x PyTorch CPU's time; and the share of native operator calls in a tiny-Llama forward +
backward, from op_counts().

    PYTHONPATH=. .venv/bin/python benchmarks/bench_pointwise.py [--json out.json]
    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/bench_pointwise.py   # single thread

On a loaded machine PyTorch's OpenMP threads spin at barriers while a peer is descheduled, which can
make the multi-threaded CPU baseline 50x slower than on a quiet machine; the single-thread run is the
steadier comparison there.
"""

import argparse

import torch
import torch.nn.functional as F
from _results import Results, add_json_arg, short_by
from _timing import compare

import torch_neuronx
from torch_neuronx.testing.tiny_models import make_tiny_llama

N = 1 << 20
TINY_OVERHEAD = 1.2
RES = Results("pointwise")


def bench(name, make_fn, group="1M elements", target=None, sync_each=True):
    """target: the most neuron's time may be, as a multiple of CPU's."""
    cpu_fn = make_fn("cpu")
    dev_fn = make_fn("neuron")
    (t_dev, d_lo, d_hi), (t_cpu, c_lo, c_hi) = compare(dev_fn, cpu_fn, sync=torch.neuron.synchronize, spread=True,
                                                       sync_each=sync_each)
    miss = short_by(t_dev / t_cpu, target, higher=False) if target else ""
    print(f"{name:28s} neuron {t_dev * 1e6:9.1f} us   cpu {t_cpu * 1e6:9.1f} us   ratio {t_cpu / t_dev:5.2f}x"
          + (f"   target <= {target}x CPU's time: {'met' if not miss else miss}" if target else ""))
    RES.add(group, name, t_dev * 1e6, "us", ref=t_cpu * 1e6, ref_name="PyTorch CPU eager", higher=False,
            spread=(d_lo * 1e6, d_hi * 1e6), ref_spread=(c_lo * 1e6, c_hi * 1e6),
            target=f"<= {target}x CPU's time" if target else None, met=(not miss) if target else None,
            miss=miss or None)


def main():
    ap = argparse.ArgumentParser()
    add_json_arg(ap)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()} (neuron kernels use as many)")
    for dtype in (torch.float32, torch.bfloat16):
        tag = "f32" if dtype == torch.float32 else "bf16"

        def binary(op):
            def make(dev):
                a = torch.randn(N, device=dev).to(dtype)
                b = torch.randn(N, device=dev).to(dtype)
                out = torch.empty(N, device=dev, dtype=dtype)
                return lambda: op(a, b, out=out)
            return make

        def silu(dev):
            a = torch.randn(N, device=dev).to(dtype)
            return lambda: F.silu(a)

        bench(f"add 1M {tag}", binary(torch.add))
        bench(f"mul 1M {tag}", binary(torch.mul))
        bench(f"silu 1M {tag}", silu)

    def cast(src, dst):
        def make(dev):
            a = torch.randn(N, device=dev).to(src)
            out = torch.empty(N, device=dev, dtype=dst)
            return lambda: out.copy_(a)
        return make

    bench("cast f32->bf16 1M", cast(torch.float32, torch.bfloat16))
    bench("cast bf16->f32 1M", cast(torch.bfloat16, torch.float32))

    for n in (1, 16):
        def tiny(dev, n=n):
            a = torch.randn(n, device=dev)
            b = torch.randn(n, device=dev)
            return lambda: torch.add(a, b)
        # A loop of eager ops synchronizes at its end, not after every op.
        bench(f"add {n} element{'s' if n > 1 else ''} f32", tiny, group="eager overhead", target=TINY_OVERHEAD,
              sync_each=False)

    # Native share on a tiny Llama forward + backward.
    model, tok = make_tiny_llama()
    model = model.to("neuron").train()
    ids = torch.randint(0, model.config.vocab_size, (2, 32), device="neuron")
    torch_neuronx.reset_op_counts()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    torch.neuron.synchronize()
    counts = torch_neuronx.op_counts()
    native = sum(c["native"] for c in counts.values())
    fallback = sum(c["fallback"] for c in counts.values())
    print(f"tiny-Llama fwd+bwd: {native} native / {native + fallback} calls "
          f"({100.0 * native / max(1, native + fallback):.1f}% native)")
    fb = torch_neuronx.fallback_ops()
    print("remaining fallbacks:", ", ".join(f"{k} x{v}" for k, v in list(fb.items())[:15]))
    RES.write(args.json)


if __name__ == "__main__":
    main()
