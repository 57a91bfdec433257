"""One command for every benchmark: measures the machine's bounds, runs each benchmark script and writes
docs/performance.md (`make bench`, or `make bench-quick` for shorter runs).

The machine section is measured here, on the machine that runs the benchmarks:
- the CPU model, its ISA extensions that the kernels choose between, cores and cache sizes (sysfs);
- read bandwidth from a read-only probe: a sum over a float32 buffer 4x the last-level cache on all threads
  (the bytes read once per pass / the time of a pass, best of several);
- the fp32 FMA peak of the GEMM micro-kernels' instruction mix (torch_neuronx._C._fma_peak_gflops).

Each benchmark then runs as its own process (so one's threads and caches do not colour the next) and its
output, which already carries neuron vs the reference measured in the same run, the ratio and the target, goes
into the report verbatim with its wall time. A benchmark that fails is reported as failed with its last lines;
the others still run.
"""
import argparse
import datetime
import os
import platform
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _timing import cpu_name  # noqa: E402

# (name, script arguments for the full report, for the quick one; None = skipped in that mode)
BENCHES = [
    ("GEMM", ["bench_gemm.py"], ["bench_gemm.py", "--quick"]),
    ("Attention", ["bench_attention.py"], ["bench_attention.py"]),
    ("Pointwise", ["bench_pointwise.py"], ["bench_pointwise.py"]),
    ("Reductions", ["bench_reduce.py"], ["bench_reduce.py"]),
    ("Generation (decode and prefill, 100M Llama)", ["bench_generate.py", "--repeats", "3"],
     ["bench_generate.py", "--dtype", "bfloat16", "--repeats", "1"]),
    ("Generation, compiled", ["bench_generate.py", "--compile", "--repeats", "3"], None),
    ("Training step (100M Llama, seq 512)", ["bench_train.py"], ["bench_train.py", "--layers", "4", "--rounds", "3"]),
    ("Diffusion (Flux-width pipeline, conv and attention shapes)", ["bench_diffusion.py"],
     ["bench_diffusion.py", "--only", "shapes"]),
    ("Collectives", ["bench_collectives.py"], ["bench_collectives.py"]),
    ("NKI kernels", ["bench_nki.py"], ["bench_nki.py", "--quick", "--no-vit"]),
    ("Share of native kernels", ["bench_native_share.py"], ["bench_native_share.py"]),
]

ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def caches():
    """[(level, type, size string, shared by n CPUs)] of cpu0 from sysfs."""
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
        shared = read("shared_cpu_list")
        out.append((read("level"), read("type"), read("size"), shared))
    return out


def size_bytes(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return int(s[:-1]) * mult[s[-1]] if s and s[-1] in mult else int(s)
    except ValueError:
        return 0


def read_bandwidth(llc):
    """GB/s of a read-only pass (sum) over float32 neuron memory 4x the LLC (at least 256 MiB)."""
    n = max(4 * llc, 256 << 20) // 4
    x = torch.ones(n, device="neuron")
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        x.sum()
        torch.neuron.synchronize()
        best = min(best, time.perf_counter() - t)
    del x
    return n * 4 / best / 1e9


def run(args, timeout):
    t = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, args[0]), *args[1:]], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=timeout)
        ok, text = p.returncode == 0, p.stdout + (p.stderr if p.returncode else "")
    except subprocess.TimeoutExpired as e:
        ok, text = False, f"{e.stdout or ''}\n(timed out after {timeout} s)"
    # Progress bars and compile chatter are not figures.
    lines = [ln for ln in text.splitlines() if ln.strip() and "it/s]" not in ln and "Warning" not in ln]
    return ok, lines, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs of fewer benchmarks")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "performance.md"))
    ap.add_argument("--only", help="comma-separated benchmark names (substring match)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per benchmark")
    a = ap.parse_args()

    import torch_neuronx

    flags = cpu_flags()
    cache = caches()
    llc = max((size_bytes(c[2]) for c in cache if c[1] in ("Unified", "Data")), default=0)
    print("measuring the machine ...", flush=True)
    bw = read_bandwidth(llc)
    peak = torch_neuronx._C._fma_peak_gflops()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    md = [
        "# Performance report",
        "",
        f"Generated by `python benchmarks/report.py{' --quick' if a.quick else ''}` "
        f"(`make bench{'-quick' if a.quick else ''}`) on commit {commit}, "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}. Each benchmark compares neuron with its reference "
        "(PyTorch CPU eager, CPU Inductor or Gloo) measured in the same process in alternating rounds "
        "(benchmarks/_timing.py); ratios are reference time / neuron time (> 1: neuron faster) unless a line "
        "says otherwise.",
        "",
        "## Machine",
        "",
        f"- CPU: {cpu_name()}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}; "
        f"{platform.machine()}",
        f"- ISA: {', '.join(f for f in ISA_FLAGS if f in flags) or 'none of ' + ', '.join(ISA_FLAGS)}",
        "- Caches (cpu0): " + "; ".join(f"L{lvl} {typ} {size} (CPUs {shared})" for lvl, typ, size, shared in cache),
        f"- Read bandwidth (read-only sum over {max(4 * llc, 256 << 20) >> 20} MiB, 4x the last-level cache, "
        f"all threads, best of 7): {bw:.1f} GB/s",
        f"- fp32 FMA peak (the GEMM micro-kernels' instruction mix on all threads): {peak:.0f} GFLOP/s",
        f"- Versions: torch {torch.__version__}, torch_neuronx {getattr(torch_neuronx, '__version__', '?')}",
        "",
        "A decode bound (bandwidth / weight bytes per token) only holds for weights several times the last-level "
        f"cache: {llc >> 20} MiB here, so the 100M-parameter benchmark model (400 MB fp32, 200 MB bf16) is "
        "partly or wholly cache-resident and its decode figures are reported as they are, not as a share of a "
        "bound.",
        "",
        "Noise: on 2 cores, any other busy process takes one of the two threads of every parallel operator, "
        "and the operator waits for it at its barrier (a 1M-element add: median 235 us alone, maxima of 4 ms "
        "beside a busy process; with another PyTorch process running, 6 ms per operator whatever its size). "
        "Figures taken while anything else ran are not comparable; the spreads below show each run's rounds.",
        "",
    ]
    only = [s.strip().lower() for s in a.only.split(",")] if a.only else None
    for name, full, quick in BENCHES:
        args = quick if a.quick else full
        if args is None or (only and not any(o in name.lower() for o in only)):
            continue
        print(f"running {name}: {' '.join(args)}", flush=True)
        ok, lines, secs = run(args, a.timeout)
        md += [f"## {name}", "", f"`python benchmarks/{' '.join(args)}`: "
               f"{'ran' if ok else 'FAILED'} in {secs:.0f} s", "", "```"]
        md += (lines if ok else lines[-40:]) + ["```", ""]
        print("\n".join(lines[-6:]), flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
