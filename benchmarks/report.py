"""One command for every benchmark: measures the machine's bounds, runs each benchmark script and writes
docs/performance.md with its plots in docs/img/ (`make bench`, or `make bench-quick` for shorter runs).

The machine section is measured here (benchmarks/machine.py), on the machine that runs the benchmarks: CPU model,
ISA, caches from sysfs, read bandwidth from a read-only probe, copy bandwidth, and the fp32 and bf16 peaks of the
instructions the GEMM uses.

Each benchmark runs as its own process (so one's threads and caches do not colour the next). Those that take
--json hand their figures over as records (benchmarks/_results.py): the neuron number, its reference measured in
the same run, the ratio, the share of a physical bound, the target and the spread over repeats. They make the
summary table and the plots; every benchmark's console output follows verbatim. A benchmark that fails is reported
as failed with its last lines; the others still run.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import machine  # noqa: E402

# (name, script arguments for the full report, for the quick one (None: skipped), takes --json)
BENCHES = [
    ("GEMM", ["bench_gemm.py"], ["bench_gemm.py", "--quick"], True),
    ("Attention", ["bench_attention.py"], ["bench_attention.py"], True),
    ("Pointwise and eager overhead", ["bench_pointwise.py"], ["bench_pointwise.py"], True),
    ("Reductions", ["bench_reduce.py"], ["bench_reduce.py"], False),
    ("Generation, eager (0.1B and a DRAM-bound ~1B Llama)",
     ["bench_generate.py", "--model", "both", "--batches", "1,4,16", "--prefills", "128,512,2048",
      "--large-prefills", "128,512", "--large-new", "32", "--repeats", "3"],
     ["bench_generate.py", "--model", "both", "--dtype", "bfloat16", "--batches", "1,16", "--new", "32",
      "--large-new", "16", "--large-prefills", "512", "--repeats", "2"], True),
    ("Generation, compiled",
     ["bench_generate.py", "--compile", "--model", "both", "--batches", "1,16", "--prefills", "512",
      "--large-prefills", "", "--large-new", "32", "--repeats", "3"],
     ["bench_generate.py", "--compile", "--model", "both", "--dtype", "bfloat16", "--batches", "1,16", "--new", "16",
      "--prefills", "512", "--large-prefills", "", "--large-new", "16", "--repeats", "2"], True),
    ("Training step (100M Llama, seq 512)", ["bench_train.py"], ["bench_train.py", "--layers", "4", "--rounds", "3"],
     True),
    ("Diffusion (Flux-width pipeline, conv and attention shapes)", ["bench_diffusion.py"],
     ["bench_diffusion.py", "--only", "shapes"], False),
    ("Collectives, 2 ranks", ["bench_collectives.py", "--nproc", "2"],
     ["bench_collectives.py", "--nproc", "2", "--sizes", "4K,1M,64M", "--no-dram"], True),
    ("Collectives, 4 ranks", ["bench_collectives.py", "--nproc", "4"],
     ["bench_collectives.py", "--nproc", "4", "--sizes", "4K,1M,64M", "--no-dram"], True),
    ("NKI kernels", ["bench_nki.py"], ["bench_nki.py", "--quick", "--no-vit"], False),
    ("Share of native kernels", ["bench_native_share.py"], ["bench_native_share.py"], False),
]

NOISE = ("Noise: on 2 cores, any other busy process takes one of the two threads of every parallel operator, "
         "and the operator waits for it at its barrier (a 1M-element add: median 235 us alone, maxima of 4 ms "
         "beside a busy process; with another PyTorch process running, 6 ms per operator whatever its size). "
         "Figures taken while anything else ran are not comparable; the spreads show each run's rounds."
         " On a cloud VM the machine itself also varies with nothing else running in it: on the 2-core EPYC VM "
         "(2026-12-07) the read probe gave 23-30 GB/s within one minute and the FMA probe 93-178 GFLOP/s within "
         "an hour, the neighbours on the physical host taking memory bandwidth and core time. On the 2-core Xeon VM "
         "(family 6 model 207, 2026-12-08) the slow phases were on the cache side: with nothing running in the VM "
         "and no steal time reported, one thread ran an fp32 GEMM 512x768x2048 at 75 GFLOP/s against 131-135 an "
         "hour before, while a GEMM whose blocks all stay in L2 lost 11%, the register-only FMA probe 8% and the "
         "read probe gave 16 GB/s: consistent with the host's other guests sharing the cores' caches (hyperthread siblings) and the "
         "L3, which no peak probe sees, so a phase can halve a GEMM figure. Bounds and peaks are "
         "measured once per benchmark, so a share of a bound carries that spread: repeat a run before reading a "
         "change of 10-20% into it.")

BOUNDS = [
    "Bounds, as the benchmarks apply them:",
    "- decode: a step reads every weight once, so tokens/s <= batch x read bandwidth / weight bytes (or the "
    "compute bound, 2 flops per parameter and token at the peak, when lower). It is applied only to a model "
    "whose weights are at least 4x the last-level cache; the 0.1B model is cache-resident and reported as its "
    "own figure, without a share;",
    "- GEMM at M >= 128: the measured peak of the dtype's instruction (fp32 FMA; bf16 on AMX tiles or "
    "AVX512-BF16);",
    "- training: MFU, 6 x parameters flops per token at the fp32 peak;",
    "- collectives: each rank must read R and write W bytes whatever the algorithm (all_reduce R = W = S; "
    "all_gather R = S/n, W = S; reduce_scatter R = S, W = S/n), and the n ranks share memory, so a call takes at "
    "least n (R + W) / copy bandwidth. Buffers that fit in the last-level cache are not bound by it.",
]


def fmt(v):
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def run(args, timeout, json_path=None):
    t = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(HERE, args[0]), *args[1:]] + (["--json", json_path] if json_path else [])
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        ok, text = p.returncode == 0, p.stdout + (p.stderr if p.returncode else "")
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        ok, text = False, f"{out}\n(timed out after {timeout} s)"
    # Progress bars and compile chatter are not figures.
    lines = [ln for ln in text.splitlines() if ln.strip() and "it/s]" not in ln and "Warning" not in ln]
    return ok, lines, time.perf_counter() - t


def summary_table(records):
    """Markdown table of every figure: neuron (spread), reference (spread), ratio, share of bound, target."""
    out = ["| benchmark | figure | neuron (min-max) | reference (min-max) | ratio | share of bound | target | |",
           "|---|---|---|---|---|---|---|---|"]
    for bench, f in records:
        sp = f.get("spread")
        rsp = f.get("ref_spread")
        neuron = f"{fmt(f['neuron'])} {f['unit']}" + (f" ({fmt(sp[0])}-{fmt(sp[1])})" if sp else "")
        ref = ""
        if f.get("ref") is not None:
            ref = f"{f.get('ref_name') or 'reference'}: {fmt(f['ref'])}" + (f" ({fmt(rsp[0])}-{fmt(rsp[1])})"
                                                                             if rsp else "")
        ratio = f"{f['ratio']:.2f}x" if f.get("ratio") else ""
        share = f"{100 * f['share']:.0f}% of {f.get('bound_name') or 'bound'}" if f.get("share") else ""
        verdict = "" if f.get("met") is None else ("met" if f["met"] else f"**missed**: {f.get('miss') or ''}")
        out.append(f"| {bench} | {f.get('group', '')} {f['name']} | {neuron} | {ref} | {ratio} | {share} | "
                   f"{f.get('target') or ''} | {verdict} |")
    return out


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return True


def plot_decode(records, path):
    """Decode tok/s against batch, neuron and CPU per model and dtype, with the read-bandwidth bound."""
    dec = [f for b, f in records if b == "generate" and f.get("phase") == "decode"]
    if not dec:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    series = {}
    for f in dec:
        series.setdefault((f["model"], f["dtype"], bool(f.get("compiled"))), []).append(f)
    for (model, dtype, compiled), fs in sorted(series.items()):
        fs.sort(key=lambda f: f["batch"])
        b = [f["batch"] for f in fs]
        tag = f"{model} {dtype}{' compiled' if compiled else ''}"
        line, = ax.plot(b, [f["neuron"] for f in fs], "o-", label=f"neuron {tag}")
        ax.plot(b, [f["ref"] for f in fs], "s--", color=line.get_color(), alpha=0.6, label=f"CPU eager {tag}")
        bounded = [f for f in fs if f.get("bound")]
        if bounded and not compiled:
            ax.plot([f["batch"] for f in bounded], [f["bound"] for f in bounded], ":", color=line.get_color(),
                    label=f"bound {model} {dtype}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel("decode tokens/s (all sequences)")
    ax.set_title("Decode against the read-bandwidth bound")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_gemm(records, meta, path):
    """GFLOP/s per shape, neuron and CPU, against the fp32 and bf16 peaks."""
    gem = [f for b, f in records if b == "gemm"]
    if not gem:
        return False
    plt = _plt()
    dtypes = sorted({f["dtype"] for f in gem})
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(10, 3.2 * len(dtypes)), squeeze=False)
    for ax, dt in zip(axes[:, 0], dtypes):
        fs = [f for f in gem if f["dtype"] == dt]
        x = range(len(fs))
        ax.bar([i - 0.2 for i in x], [f["neuron"] for f in fs], 0.4, label="neuron")
        ax.bar([i + 0.2 for i in x], [f["ref"] for f in fs], 0.4, label="PyTorch CPU (oneDNN)")
        peak = meta.get({"float32": "fp32_peak", "bfloat16": "bf16_peak"}.get(dt, ""))
        if peak:
            ax.axhline(peak, color="k", ls="--", lw=1, label=f"{dt} peak {peak:.0f}")
            ax.axhline(0.85 * peak, color="k", ls=":", lw=1, label="85% of peak (target, M >= 128)")
            ax.set_ylim(top=1.05 * max(peak, max(max(f["neuron"], f["ref"] or 0) for f in fs)))
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{f['m']}x{f['k']}x{f['n']}" for f in fs], rotation=60, fontsize=6)
        ax.set_ylabel("GFLOP/s")
        ax.set_title(f"GEMM {dt}, F.linear(x[M, K], W[N, K]) as MxKxN")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def plot_collectives(records, path):
    """Bus bandwidth against message size, neuron and Gloo, per op and rank count, with the memory bound."""
    col = [f for b, f in records if b == "collectives" and f.get("op")]
    if not col:
        return False
    plt = _plt()
    ranks = sorted({f["ranks"] for f in col})
    fig, axes = plt.subplots(1, len(ranks), figsize=(6 * len(ranks), 4), squeeze=False)
    for ax, n in zip(axes[0], ranks):
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            fs = sorted((f for f in col if f["ranks"] == n and f["op"] == op), key=lambda f: f["bytes"])
            if not fs:
                continue
            s = [f["bytes"] for f in fs]
            line, = ax.plot(s, [f["neuron"] for f in fs], "o-", label=f"neuron {op}")
            ax.plot(s, [f["ref"] for f in fs], "s--", color=line.get_color(), alpha=0.6, label=f"Gloo {op}")
            ax.plot(s, [f["memory_bound"] for f in fs], ":", color=line.get_color(), alpha=0.8,
                    label=f"memory bound {op}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"Collectives, {n} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    return _save(fig, path)


def render(m, results, sections, quick, commit, img_dir, md_dir, img_prefix="perf", out_arg=""):
    """The report's markdown: machine, bounds, summary table, plots, then every benchmark's output.
    results: [(bench, {"meta", "figures"})]; sections: [(name, args, ok, lines, seconds)]."""
    records = [(r["bench"], f) for r in results for f in r["figures"]]
    meta = {}
    for r in results:
        meta.update(r.get("meta") or {})
    md = [
        "# Performance report",
        "",
        f"Generated by `python benchmarks/report.py{' --quick' if quick else ''}{out_arg}` "
        f"{'' if out_arg else '(`make bench' + ('-quick' if quick else '') + '`) '}on commit {commit}, "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}. Each benchmark compares neuron with its reference "
        "(PyTorch CPU eager, CPU Inductor or Gloo) measured in the same process in alternating rounds "
        "(benchmarks/_timing.py). Ratios are > 1 when neuron is better, whatever the unit; spreads are the "
        "min-max over the repeats.",
        "",
        "## Machine",
        "",
        *machine.describe(m),
        "",
        *BOUNDS,
        "",
        NOISE,
        "",
    ]
    if records:
        met = sum(1 for _, f in records if f.get("met") is True)
        missed = sum(1 for _, f in records if f.get("met") is False)
        md += ["## Figures", "", f"{len(records)} figures; {met} targets met, {missed} missed.", ""]
        if meta.get("peak_suspect"):  # bench_gemm: a GEMM still ran above the re-probed peak
            md += [f"**The measured peak is suspect** ({meta['peak_suspect']}): the shares of the peak below are "
                   "too high and their 'met' cannot be trusted; rerun on an idle machine.", ""]
        md += [*summary_table(records), ""]
    plots = [("decode", "Decode tokens/s against the bound", lambda p: plot_decode(records, p)),
             ("gemm", "GEMM GFLOP/s against the peaks", lambda p: plot_gemm(records, meta, p)),
             ("collectives", "Collectives' bus bandwidth against message size", lambda p: plot_collectives(records, p))]
    drawn = []
    for key, title, fn in plots:
        path = os.path.join(img_dir, f"{img_prefix}_{key}.png")
        try:
            if fn(path):
                drawn.append((title, os.path.relpath(path, md_dir)))
        except ImportError as e:  # matplotlib missing: the report still has its tables
            md += [f"(plots skipped: {e})", ""]
            break
    if drawn:
        md += ["## Plots", ""]
        for title, rel in drawn:
            md += [f"### {title}", "", f"![{title}]({rel})", ""]
    md += ["## Benchmark output", ""]
    for name, args, ok, lines, secs in sections:
        md += [f"### {name}", "", f"`python benchmarks/{' '.join(args)}`: {'ran' if ok else 'FAILED'} in {secs:.0f} s",
               "", "```"]
        md += (lines if ok else lines[-40:]) + ["```", ""]
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs of fewer benchmarks")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "performance.md"))
    ap.add_argument("--only", help="comma-separated benchmark names (substring match)")
    ap.add_argument("--timeout", type=int, default=2400, help="seconds per benchmark")
    a = ap.parse_args()

    print("measuring the machine ...", flush=True)
    m = machine.measure()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    only = [s.strip().lower() for s in a.only.split(",")] if a.only else None
    results, sections = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, full, quick, takes_json) in enumerate(BENCHES):
            args = quick if a.quick else full
            if args is None or (only and not any(o in name.lower() for o in only)):
                continue
            print(f"running {name}: {' '.join(args)}", flush=True)
            jpath = os.path.join(tmp, f"{i}.json") if takes_json else None
            ok, lines, secs = run(args, a.timeout, jpath)
            sections.append((name, args, ok, lines, secs))
            if jpath and os.path.exists(jpath):
                with open(jpath) as f:
                    results.append(json.load(f))
            print("\n".join(lines[-6:]), flush=True)
    md_dir = os.path.dirname(os.path.abspath(a.out))
    img_dir = os.path.join(md_dir, "img")
    os.makedirs(img_dir, exist_ok=True)
    # A report written beside another (e.g. docs/performance-avx2.md for a second CPU) names its plots after
    # itself instead of overwriting the other's.
    stem = os.path.splitext(os.path.basename(a.out))[0]
    md = render(m, results, sections, a.quick, commit, img_dir, md_dir,
                img_prefix="perf" if stem == "performance" else stem,
                out_arg="" if stem == "performance" else f" --out {os.path.relpath(os.path.abspath(a.out), ROOT)}")
    with open(a.out, "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
