"""GEMM on neuron vs PyTorch CPU at the shapes of a ~100M-parameter Llama (hidden 768, MLP 2048/3072,
vocab 32000), as F.linear(x[M, K], W[N, K]) for M = 1, 8 (decode) and 128, 512 (prefill/training),
fp32 and bf16, both measured in this run, in alternating rounds (_timing.py). Also measures the machine's peaks with
register-only loops in the kernel library (fp32 FMA; bf16 on AMX tiles, else AVX512-BF16) and reports large shapes
as % of the peak of their dtype.

Targets (issue 27): every shape >= 1.0x PyTorch CPU; large shapes (M >= 128) >= 85% of the matching peak.

    python benchmarks/bench_gemm.py [--quick] [--json out.json]
"""
import argparse

import torch
import torch.nn.functional as F
from _results import Results, add_json_arg, short_by
from _timing import compare

import torch_neuronx

KN = [(768, 768), (768, 2048), (2048, 768), (768, 3072), (3072, 768), (768, 32000)]
MS = [1, 8, 128, 512]
LARGE_M = 128
PEAK_TARGET = 0.85


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer shapes, shorter timing")
    add_json_arg(ap)
    args = ap.parse_args()
    res = Results("gemm")
    budget = 0.05 if args.quick else 0.25
    kns = KN[:3] + KN[-1:] if args.quick else KN

    threads = torch.get_num_threads()
    fp32_peak = torch_neuronx._C._fma_peak_gflops()
    bf16_peak, bf16_method = torch_neuronx._C._bf16_peak_gflops()
    if bf16_peak <= 0:
        bf16_peak = fp32_peak  # no bf16 instruction: bf16 runs on the fp32 micro-kernels
        bf16_method = "fp32 FMA"

    def probe(dtype):
        if dtype == torch.bfloat16 and bf16_method != "fp32 FMA":
            return torch_neuronx._C._bf16_peak_gflops()[0]
        return torch_neuronx._C._fma_peak_gflops()
    peaks = {torch.float32: fp32_peak, torch.bfloat16: bf16_peak}
    res.meta.update(fp32_peak=fp32_peak, bf16_peak=bf16_peak, bf16_method=bf16_method)
    print(f"threads {threads}, micro-kernels {torch_neuronx._C._gemm_isa()}, "
          f"measured fp32 FMA peak {fp32_peak:.1f} GFLOP/s, bf16 peak {bf16_peak:.1f} GFLOP/s ({bf16_method})")
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
                (t_n, tn_lo, tn_hi), (t_c, tc_lo, tc_hi) = compare(lambda: F.linear(xn, wn), lambda: F.linear(x, w),
                                                                   2 * budget, spread=True)
                flops = 2.0 * m * nn * k
                gf = flops / t_n * 1e-9
                ratio = t_c / t_n
                peak = peaks[dtype]
                pct = gf / peak if peak > 0 else 0.0
                large = m >= LARGE_M
                name = str(dtype).replace("torch.", "")
                if large and pct > 1.02:
                    # Above the peak: the probe was disturbed (one that lost a core read half the peak and
                    # made every share look met). Probe again and keep the higher; say so if it still is.
                    peak = peaks[dtype] = max(peak, probe(dtype))
                    pct = gf / peak
                    print(f"  (re-probed the {name} peak: {peak:.1f} GFLOP/s)")
                    if pct > 1.02:
                        res.meta["peak_suspect"] = f"{name} M={m} K={k} N={nn} ran at {100 * pct:.0f}% of the peak"
                print(f"{name:9} {m:4d} {k:5d} {nn:6d} {t_n * 1e6:10.1f} {t_c * 1e6:10.1f} {ratio:6.2f} "
                      f"{gf:8.1f} {100 * pct if large else float('nan'):6.1f}")
                if ratio < 1.0:
                    misses.append(f"{name} M={m} K={k} N={nn}: {ratio:.2f}x CPU (needs {1 / ratio:.2f}x faster)")
                if large and pct < PEAK_TARGET:
                    misses.append(f"{name} M={m} K={k} N={nn}: {100 * pct:.0f}% of the {name} peak "
                                  f"(target {100 * PEAK_TARGET:.0f}%, short by {100 * (PEAK_TARGET - pct):.0f} points)")
                miss = "; ".join(x for x in (short_by(ratio, 1.0),
                                             short_by(pct, PEAK_TARGET) if large else "") if x)
                res.add(name, f"M={m} K={k} N={nn}", gf, "GFLOP/s", ref=flops / t_c * 1e-9,
                        ref_name="PyTorch CPU eager", spread=(flops / tn_hi * 1e-9, flops / tn_lo * 1e-9),
                        ref_spread=(flops / tc_hi * 1e-9, flops / tc_lo * 1e-9),
                        bound=peak if large else None, bound_name=f"{name} peak" if large else None,
                        target=f">= 1.0x CPU, >= {100 * PEAK_TARGET:.0f}% of peak" if large else ">= 1.0x CPU",
                        met=not miss, miss=miss or None, m=m, k=k, n=nn, dtype=name)
    print()
    if misses:
        print(f"targets missed ({len(misses)}):")
        for line in misses:
            print("  " + line)
    else:
        print("all targets met")
    res.meta.update(fp32_peak=peaks[torch.float32], bf16_peak=peaks[torch.bfloat16])  # after any re-probe
    if "peak_suspect" in res.meta:
        print(f"peak still suspect: {res.meta['peak_suspect']}")
    res.write(args.json)


if __name__ == "__main__":
    main()
