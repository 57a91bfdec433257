"""GEMM on neuron vs PyTorch CPU at the shapes of a ~100M-parameter Llama (hidden 768, MLP 2048/3072,
vocab 32000), as F.linear(x[M, K], W[N, K]) for M = 1, 8 (decode) and 128, 512 (prefill/training),
fp32 and bf16, both measured in this run, in alternating rounds (_timing.py). Also measures the machine's fp32 FMA peak with a
register-only FMA loop in the kernel library and reports large shapes as % of it.

Targets: every shape >= 1.0x PyTorch CPU; large shapes (M >= 128) >= 75% of the fp32 FMA peak.

    python benchmarks/bench_gemm.py [--quick]
"""
import argparse

import torch
import torch.nn.functional as F
from _timing import compare

import torch_neuronx

KN = [(768, 768), (768, 2048), (2048, 768), (768, 3072), (3072, 768), (768, 32000)]
MS = [1, 8, 128, 512]
LARGE_M = 128
PEAK_TARGET = 0.75


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer shapes, shorter timing")
    args = ap.parse_args()
    budget = 0.05 if args.quick else 0.25
    kns = KN[:3] + KN[-1:] if args.quick else KN

    threads = torch.get_num_threads()
    peak = torch_neuronx._C._fma_peak_gflops()
    print(f"threads {threads}, micro-kernels {torch_neuronx._C._gemm_isa()}, "
          f"measured fp32 FMA peak {peak:.1f} GFLOP/s")
    print(f"{'dtype':9} {'M':>4} {'K':>5} {'N':>6} {'neuron us':>10} {'cpu us':>10} {'ratio':>6} "
          f"{'GFLOP/s':>8} {'%peak':>6}")
    misses = []
    for dtype in (torch.float32, torch.bfloat16):
        for k, nn in kns:
            g = torch.Generator().manual_seed(0)
            w = torch.randn(nn, k, generator=g).to(dtype)
            wn = w.to("neuron")
            for m in MS:
                x = torch.randn(m, k, generator=g).to(dtype)
                xn = x.to("neuron")
                t_n, t_c = compare(lambda: F.linear(xn, wn), lambda: F.linear(x, w), 2 * budget)
                flops = 2.0 * m * nn * k
                gf = flops / t_n * 1e-9
                ratio = t_c / t_n
                pct = gf / peak if peak > 0 else 0.0
                large = m >= LARGE_M
                name = str(dtype).replace("torch.", "")
                print(f"{name:9} {m:4d} {k:5d} {nn:6d} {t_n * 1e6:10.1f} {t_c * 1e6:10.1f} {ratio:6.2f} "
                      f"{gf:8.1f} {100 * pct if large else float('nan'):6.1f}")
                if ratio < 1.0:
                    misses.append(f"{name} M={m} K={k} N={nn}: {ratio:.2f}x CPU (needs {1 / ratio:.2f}x faster)")
                if large and dtype == torch.float32 and pct < PEAK_TARGET:
                    misses.append(f"{name} M={m} K={k} N={nn}: {100 * pct:.0f}% of fp32 peak "
                                  f"(target {100 * PEAK_TARGET:.0f}%, short by {100 * (PEAK_TARGET - pct):.0f} points)")
    print()
    if misses:
        print(f"targets missed ({len(misses)}):")
        for line in misses:
            print("  " + line)
    else:
        print("all targets met")


if __name__ == "__main__":
    main()
