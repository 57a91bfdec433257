"""The bounds of the machine the benchmarks run on, measured here rather than taken from a data sheet.

- CPU model, the ISA extensions the kernels choose between, logical CPUs, caches of cpu0 from sysfs;
- read bandwidth: a read-only probe, the sum of a float32 neuron tensor 4x the last-level cache (at least
  256 MiB) on all threads, bytes read per pass / time of the best pass. A copy would count its writes
  too, and a write costs a read-for-ownership besides, so a copy-based figure is not the bound a
  read-mostly workload (decode) faces;
- copy bandwidth (bytes read + written by a device copy between buffers 2x the LLC each), the bound of traffic that
  reads and writes at once;
- the fp32 FMA peak (torch_neuronx._C._fma_peak_gflops, the GEMM micro-kernels' instruction mix) and the bf16
  peak on the instruction the bf16 GEMM uses (_C._bf16_peak_gflops: AMX tiles, else AVX512-BF16 where it
  outruns the FMAs, else the fp32 FMA peak).

    python benchmarks/machine.py [--json out.json]
"""
import argparse
import functools
import json
import os
import platform
import time

ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def size_bytes(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return int(s[:-1]) * mult[s[-1]] if s and s[-1] in mult else int(s)
    except ValueError:
        return 0


def caches():
    """[{level, type, size, bytes, shared}] of cpu0 from sysfs."""
    out = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(e for e in os.listdir(base) if e.startswith("index"))
    except OSError:
        return out
    for e in entries:
        def read(name):
            try:
                with open(os.path.join(base, e, name)) as f:
                    return f.read().strip()
            except OSError:
                return "?"
        size = read("size")
        out.append({"level": read("level"), "type": read("type"), "size": size, "bytes": size_bytes(size),
                    "shared": read("shared_cpu_list")})
    return out


def llc_bytes(cache=None):
    cache = caches() if cache is None else cache
    return max((c["bytes"] for c in cache if c["type"] in ("Unified", "Data")), default=0)


def read_bandwidth(llc=None, passes=7):
    """(GB/s, MiB read): best of `passes` read-only sums over float32 neuron memory 4x the LLC."""
    import torch
    import torch_neuronx  # noqa: F401

    llc = llc_bytes() if llc is None else llc
    n = max(4 * llc, 256 << 20) // 4
    x = torch.ones(n, device="neuron")
    x.sum()
    torch.neuron.synchronize()
    best = float("inf")
    for _ in range(passes):
        t = time.perf_counter()
        x.sum()
        torch.neuron.synchronize()
        best = min(best, time.perf_counter() - t)
    del x
    return n * 4 / best / 1e9, n * 4 >> 20


def copy_bandwidth(llc=None, passes=5):
    """(GB/s of bytes read + written, MiB each side): best of `passes` device copies between float32 neuron
    buffers of 2x the LLC each. The bound of traffic that reads and writes at once (collectives): on this
    kind of host two cores' reads alone do not saturate memory (a core's outstanding misses limit it), and a
    copy's streaming stores add their bandwidth on top, so a read-only figure would understate it."""
    import torch
    import torch_neuronx  # noqa: F401

    llc = llc_bytes() if llc is None else llc
    n = max(2 * llc, 128 << 20) // 4
    src = torch.ones(n, device="neuron")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.neuron.synchronize()
    best = float("inf")
    for _ in range(passes):
        t = time.perf_counter()
        dst.copy_(src)
        torch.neuron.synchronize()
        best = min(best, time.perf_counter() - t)
    del src, dst
    return 2 * n * 4 / best / 1e9, n * 4 >> 20


@functools.lru_cache(maxsize=1)
def measure():
    """Everything above as a dict (measured once per process: the probes take a few seconds)."""
    import torch
    import torch_neuronx

    cache = caches()
    llc = llc_bytes(cache)
    flags = cpu_flags()
    bw, mib = read_bandwidth(llc)
    cbw, cmib = copy_bandwidth(llc)
    fp32 = torch_neuronx._C._fma_peak_gflops()
    bf16, bf16_method = torch_neuronx._C._bf16_peak_gflops()
    return {
        "cpu": cpu_name(),
        "arch": platform.machine(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "caches": cache,
        "llc_bytes": llc,
        "read_bw_gbs": bw,
        "read_probe_mib": mib,
        "copy_bw_gbs": cbw,
        "copy_probe_mib": cmib,
        "fp32_peak_gflops": fp32,
        "bf16_peak_gflops": bf16,
        "bf16_peak_method": bf16_method,
        "gemm_isa": torch_neuronx._C._gemm_isa(),
        "torch": torch.__version__,
    }


def describe(m):
    """Markdown lines for the report's machine section."""
    return [
        f"- CPU: {m['cpu']}, {m['logical_cpus']} logical CPUs, torch threads {m['torch_threads']}; {m['arch']}",
        f"- ISA: {', '.join(m['isa']) or 'none of ' + ', '.join(ISA_FLAGS)}; GEMM micro-kernels {m['gemm_isa']}",
        "- Caches (cpu0, sysfs): " + "; ".join(f"L{c['level']} {c['type']} {c['size']} (CPUs {c['shared']})"
                                               for c in m["caches"]),
        f"- Read bandwidth (read-only sum over {m['read_probe_mib']} MiB, >= 4x the last-level cache, all threads, "
        f"best of 7): {m['read_bw_gbs']:.1f} GB/s",
        f"- Copy bandwidth (read + written bytes of a device copy between two {m['copy_probe_mib']} MiB buffers, "
        f"all threads, best of 5): {m['copy_bw_gbs']:.1f} GB/s",
        f"- fp32 FMA peak (the GEMM micro-kernels' instruction mix, all threads): {m['fp32_peak_gflops']:.0f} GFLOP/s",
        f"- bf16 peak ({m['bf16_peak_method']}, all threads): {m['bf16_peak_gflops']:.0f} GFLOP/s",
        f"- torch {m['torch']}",
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    m = measure()
    print("\n".join(describe(m)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(m, f, indent=1)


if __name__ == "__main__":
    main()
