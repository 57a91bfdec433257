"""NKI kernels on the neuron device: matmul, rmsnorm, softmax and add, written in the style of the NKI docs'
examples, each timed

* against the device's native torch op for the same math (both on neuron tensors), and
* against a plain numpy execution of the same kernel (``nki.simulate`` on numpy arrays),

plus the vit-mlp-nki example kernels (examples/kernels/): the fused MLP against ViTMLP's eager forward at
ViT-Base width, and a ViT-Base-shaped random ViTForImageClassification kernelized with its ViTLayer and
ViTAttention layers against eager on neuron and on CPU.
Timing: benchmarks/_timing.compare (alternating rounds, medians). The issue's targets are >= 0.5x the native
op and >= 20x the numpy execution. On neuron tensors a kernel runs nki's fast path (traced once per signature,
replayed in C on the kernel library; NKI_COMPILE=0 runs the interpreter instead); nki.simulate on numpy arrays
is the per-instruction numpy interpreter. Results and analysis: docs/nki.md.

    .venv/bin/python benchmarks/bench_nki.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the nki package lives at the repo root
sys.path.insert(0, str(Path(__file__).resolve().parent))

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
from _timing import compare, cpu_name  # noqa: E402


# ----------------------------------------------------------------------------------------------- kernels
@nki.jit
def matmul_kernel(lhsT, rhs):
    """result[M, N] = lhsT.T @ rhs: 128 x 128 stationary tiles, 512-wide moving tiles, K accumulated in PSUM;
    the stationary tiles of a row block are loaded once and reused across N (the docs' hoisted-load form)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        a = nl.ndarray((K // TK, nl.par_dim(TK), TM), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(K // TK):
            nisa.dma_copy(dst=a[k], src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
        for n in nl.affine_range(N // TN):
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.sequential_range(K // TK):
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b, src=rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(dst=acc, stationary=a[k], moving=b)
            o = nl.ndarray((TM, TN), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o, src=acc)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=o)
    return result


@nki.jit
def rmsnorm_kernel(x, w):
    """out = x * rsqrt(mean(x^2, -1) + 1e-6) * w over [N, D] rows, 128 rows per tile (tile API)."""
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    iw = nl.arange(1)[:, None]
    iy = nl.arange(D)[None, :]
    wt = nl.load(w.reshape((1, D))[iw, iy])
    ix = nl.arange(128)[:, None]
    for i in nl.affine_range((N + 127) // 128):
        rows = i * 128 + ix
        t = nl.load(x[rows, iy], mask=(rows < N))
        ss = nl.sum(nl.square(t), axis=1, keepdims=True)
        r = nl.rsqrt(nl.add(nl.multiply(ss, 1.0 / D), 1e-6))
        y = nl.multiply(nl.multiply(t, r), wt.broadcast_to((128, D)))
        nl.store(out[rows, iy], value=y, mask=(rows < N))
    return out


@nki.jit
def softmax_kernel(x):
    """Row softmax of [R, C], 128 rows per tile: max, exp(x - max) with the row sum, scale by 1/sum."""
    R, C = x.shape
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    ix = nl.mgrid[0:128, 0:C]
    for r in nl.affine_range((R + 127) // 128):
        rows = r * 128 + ix.p
        t = nl.load(x[rows, ix.x], mask=(rows < R))
        mx = nl.max(t, axis=1, keepdims=True)
        e = nl.exp(nl.subtract(t, mx))
        s = nl.sum(e, axis=1, keepdims=True)
        nl.store(out[rows, ix.x], value=nl.multiply(e, nl.reciprocal(s)), mask=(rows < R))
    return out


@nki.jit
def add_kernel(a, b):
    """c = a + b over an SPMD grid [R / 128, C / 512]: one [128, 512] tile per program."""
    c = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i, j = nl.program_id(0), nl.program_id(1)
    ta = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a[i * 128:(i + 1) * 128, j * 512:(j + 1) * 512])
    nisa.dma_copy(dst=tb, src=b[i * 128:(i + 1) * 128, j * 512:(j + 1) * 512])
    nisa.tensor_tensor(dst=ta, data1=ta, data2=tb, op=nl.add)
    nisa.dma_copy(dst=c[i * 128:(i + 1) * 128, j * 512:(j + 1) * 512], src=ta)
    return c


# ----------------------------------------------------------------------------------------------- cases
def cases(quick: bool):
    g = torch.Generator().manual_seed(0)
    s = 1 if quick else 2

    def t(*shape):
        return torch.randn(*shape, generator=g)

    M = K = 256 * s
    N = 512 * s
    lhsT, rhs = t(K, M), t(K, N)
    yield (f"matmul fp32 {M}x{K}x{N}", matmul_kernel, (lhsT, rhs), lambda a, b: torch.matmul(a.t(), b),
           lambda a, b: a.t() @ b)
    R, D = 512 * s, 1024
    x, w = t(R, D), t(D)
    yield (f"rmsnorm fp32 {R}x{D}", rmsnorm_kernel, (x, w),
           lambda x, w: torch.nn.functional.rms_norm(x, (D,), w, 1e-6),
           lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    x = t(R, D)
    yield (f"softmax fp32 {R}x{D}", softmax_kernel, (x,), lambda x: torch.softmax(x, -1),
           lambda x: torch.softmax(x, -1))
    a, b = t(R, 2048), t(R, 2048)
    yield (f"add fp32 {R}x2048", add_kernel[R // 128, 2048 // 512], (a, b), torch.add, torch.add)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller shapes and budgets")
    ap.add_argument("--no-vit", action="store_true", help="skip the ViT kernels")
    ap.add_argument("--vit-layers", type=int, default=12, help="encoder layers of the ViT-Base-shaped model")
    args = ap.parse_args()
    budget = 0.3 if args.quick else 1.0
    rounds = 3 if args.quick else 5
    sync = torch.neuron.synchronize
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; torch {torch.__version__}; "
          f"nki {nki.__version__} (fast path {'on' if nki._compile.enabled() else 'off'})")
    print(f"{'kernel':28s} {'nki/neuron ms':>13s} {'native ms':>10s} {'numpy ms':>9s} "
          f"{'vs native':>10s} {'vs numpy':>9s}  max|err|")
    for name, kern, cpu_args, native, ref in cases(args.quick):
        dev_args = [a.to("neuron") for a in cpu_args]
        np_args = [a.numpy() for a in cpu_args]
        out = kern(*dev_args)
        err = (out.cpu() - ref(*cpu_args)).abs().max().item()
        sim = nki.simulate(kern)
        t_k, t_native = compare(lambda: kern(*dev_args), lambda: native(*dev_args), budget, rounds, sync)
        t_k2, t_np = compare(lambda: kern(*dev_args), lambda: sim(*np_args), budget, rounds, sync)
        tk = min(t_k, t_k2)
        print(f"{name:28s} {tk * 1e3:13.2f} {t_native * 1e3:10.3f} {t_np * 1e3:9.2f} "
              f"{t_native / tk:9.4f}x {t_np / tk:8.2f}x  {err:.1e}", flush=True)
    st = nki.compile_stats()
    print(f"fast path: {st['compiled_calls']} replayed calls, {st['interpreted_calls']} interpreted "
          f"(nki.simulate and first calls), {len(st['fallbacks'])} signatures left to the interpreter"
          + "".join(f"\n  fallback {k}: {why}" for k, why in st["fallbacks"]))
    if not args.no_vit:
        vit_mlp(budget, rounds, sync)
        vit_model(args.vit_layers, sync)
    print("ratios: time of the other side / time of the NKI kernel on neuron (>1: the kernel is faster); "
          "targets (issue 25): >= 0.5x native, >= 20x numpy")


def vit_mlp(budget, rounds, sync):
    """The vit-mlp-nki example kernel at ViT-Base width (197 tokens, 768 -> 3072 -> 768) vs ViTMLP eager on
    neuron and on CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import kernels

    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTMLP

    mod = kernels.get_local_kernel(ROOT / "examples" / "kernels" / "vit-mlp-nki")
    torch.manual_seed(0)
    mlp = ViTMLP(ViTConfig()).eval()
    x = torch.randn(1, 197, 768)
    mlp_n, x_n = ViTMLP(ViTConfig()).eval().to("neuron"), x.to("neuron")
    mlp_n.load_state_dict(mlp.state_dict())
    with torch.no_grad():
        err = (mod.vit_mlp(x_n, mlp_n.fc1, mlp_n.fc2).cpu() - mlp(x)).abs().max().item()
        t_k, t_eager = compare(lambda: mod.vit_mlp(x_n, mlp_n.fc1, mlp_n.fc2), lambda: mlp_n(x_n), budget, rounds,
                               sync)
        t_k2, t_cpu = compare(lambda: mod.vit_mlp(x_n, mlp_n.fc1, mlp_n.fc2), lambda: mlp(x), budget, rounds, sync)
    tk = min(t_k, t_k2)
    print(f"{'vit-mlp-nki 197x768x3072':28s} {tk * 1e3:13.2f} {t_eager * 1e3:10.3f} {'-':>9s} "
          f"{t_eager / tk:9.4f}x {'-':>9s}  {err:.1e}   (native = ViTMLP eager on neuron; "
          f"ViTMLP eager on CPU {t_cpu * 1e3:.3f} ms, kernel speedup over CPU {t_cpu / tk:.4f}x)")


def vit_model(layers, sync):
    """A ViT-Base-shaped random ViTForImageClassification (224 px, patch 16, 768/3072, batch 1): eager on
    neuron, kernelized with vit-mlp-nki's ViTLayer (LayerNorm + MLP + residual fused) and ViTAttention (fused
    attention), and eager on CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import kernels
    from transformers import ViTConfig, ViTForImageClassification
    from transformers.models.vit.modeling_vit import ViTAttention, ViTLayer

    torch.manual_seed(0)
    cpu = ViTForImageClassification(ViTConfig(num_hidden_layers=layers, num_labels=1000)).eval()
    dev = ViTForImageClassification(ViTConfig(num_hidden_layers=layers, num_labels=1000)).eval().to("neuron")
    dev.load_state_dict(cpu.state_dict())
    px = torch.randn(1, 3, 224, 224)
    px_n = px.to("neuron")
    kernels.replace_kernel_forward_from_hub(ViTLayer, "ViTLayer")
    kernels.replace_kernel_forward_from_hub(ViTAttention, "ViTAttention")
    repo = ROOT / "examples" / "kernels" / "vit-mlp-nki"
    mapping = {name: {"neuron": kernels.LocalLayerRepository(repo_path=repo, layer_name=name)}
               for name in ("ViTLayer", "ViTAttention")}
    import copy

    kdev = copy.deepcopy(dev)
    with kernels.use_kernel_mapping(mapping):
        kdev = kernels.kernelize(kdev, device="neuron", mode=kernels.Mode.INFERENCE)
    with torch.no_grad():
        err = (kdev(pixel_values=px_n).logits.cpu() - dev(pixel_values=px_n).logits.cpu()).abs().max().item()
        t_k, t_eager = compare(lambda: kdev(pixel_values=px_n), lambda: dev(pixel_values=px_n), 0.5, 3, sync)
        t_k2, t_cpu = compare(lambda: kdev(pixel_values=px_n), lambda: cpu(pixel_values=px), 0.5, 3, sync)
    tk = min(t_k, t_k2)
    print(f"ViT-Base-shaped ({layers} layers, 1x3x224x224) kernelized {tk * 1e3:.1f} ms, eager neuron "
          f"{t_eager * 1e3:.1f} ms, eager CPU {t_cpu * 1e3:.1f} ms: speedup {t_eager / tk:.3f}x over eager neuron, "
          f"{t_cpu / tk:.3f}x over CPU (launch post on Trainium: up to 2.4x); max|logits diff| {err:.1e}")


if __name__ == "__main__":
    main()
