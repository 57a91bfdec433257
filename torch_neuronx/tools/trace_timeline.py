"""Renders a Chrome trace exported by torch.profiler as a timeline PNG (matplotlib).

    python -m torch_neuronx.tools.trace_timeline TRACE.json OUT.png [--start-ms A --end-ms B]
    python -m torch_neuronx.tools.trace_timeline --demo OUT.png [--trace TRACE.json]

One row per thread and nesting depth: the host thread's operators (CPU ops, record_function ranges) and,
below them, the neuron devices' kernels ("[neuron] ...": native kernels, kernels Inductor generated, fallback ops,
collectives and compiled graphs). `--demo` profiles a small workload on neuron (an MLP training step, a fallback op and a
compiled function) and renders its trace; docs/img/profiler_trace.png was made with it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Tuple

COLORS = {"native": "#2b8cbe", "generated": "#6baed6", "fallback": "#e34a33", "collective": "#31a354",
          "compiled graph": "#756bb1"}
CPU_COLOR = "#bdbdbd"


def _rows(events: List[Dict[str, Any]]) -> List[Tuple[str, List[Dict[str, Any]]]]:
    """(label, events) per (process, thread, depth); device rows last."""
    by_thread: Dict[Tuple[Any, Any], List[Dict[str, Any]]] = {}
    names: Dict[Any, str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"].get("name", str(e["pid"]))
    for e in events:
        if e.get("ph") == "X" and e.get("dur", 0) > 0 and e.get("cat") in ("cpu_op", "user_annotation", "kernel",
                                                                            "gpu_user_annotation"):
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    rows = []
    for (pid, tid), evs in sorted(by_thread.items(), key=lambda kv: (kv[1][0].get("cat") == "kernel", str(kv[0]))):
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        depth_rows: List[List[Dict[str, Any]]] = []
        stack: List[float] = []  # end times of the open events
        for e in evs:
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            d = len(stack)
            while len(depth_rows) <= d:
                depth_rows.append([])
            depth_rows[d].append(e)
            stack.append(e["ts"] + e["dur"])
        device = evs[0].get("cat") == "kernel"
        who = f"{names.get(pid, pid)} (device)" if device else f"host thread {tid}"
        for d, r in enumerate(depth_rows[:4]):
            rows.append((f"{who}{'' if d == 0 else f' +{d}'}", r))
    return rows


def render(trace_path: str, png_path: str, title: str = "", start_ms: float | None = None,
           end_ms: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with open(trace_path) as fh:
        events = json.load(fh)["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X" and e.get("dur", 0) > 0 and e.get("cat") in ("cpu_op", "kernel")]
    t0 = min(e["ts"] for e in xs)
    lo = t0 + (start_ms or 0) * 1e3
    hi = t0 + end_ms * 1e3 if end_ms is not None else max(e["ts"] + e["dur"] for e in xs)
    rows = _rows([e for e in events if e.get("ph") != "X" or (e["ts"] + e.get("dur", 0) >= lo and e["ts"] <= hi)])
    fig, ax = plt.subplots(figsize=(16, 0.55 * len(rows) + 1.6), dpi=110)
    span_ms = (hi - lo) / 1e3
    for i, (label, evs) in enumerate(rows):
        y = len(rows) - 1 - i
        for e in evs:
            s = (max(e["ts"], lo) - lo) / 1e3
            w = (min(e["ts"] + e["dur"], hi) - max(e["ts"], lo)) / 1e3
            if w <= 0:
                continue
            kind = e.get("args", {}).get("kind")
            color = COLORS.get(kind, CPU_COLOR)
            ax.barh(y, w, left=s, height=0.8, color=color, edgecolor="black", linewidth=0.3)
            name = e["name"]
            for prefix in ("[neuron] ", "[neuron fallback] ", "[neuron graph] ", "[neuron collective] "):
                name = name.replace(prefix, "")
            name = name.split(" (")[0]
            dims = e.get("args", {}).get("Input Dims")
            # A label only where it fits: ~250 characters span the plot's width.
            for text in (f"{name} {dims[0]}" if dims and dims[0] else name, name):
                if len(text) * span_ms / 250 <= w:
                    ax.text(s + w / 2, y, text, ha="center", va="center", fontsize=6.5, clip_on=True,
                            color="white" if color != CPU_COLOR else "black")
                    break
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)], fontsize=8)
    ax.set_xlim(0, span_ms)
    ax.set_xlabel("ms since the first event")
    ax.set_title(title or f"torch.profiler trace: {trace_path}", fontsize=10)
    handles = [Patch(color=CPU_COLOR, label="CPU op / range")] + [Patch(color=c, label=f"neuron {k}")
                                                                   for k, c in COLORS.items()]
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(handles))
    ax.grid(axis="x", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)


def demo(trace_path: str) -> None:
    """Profiles a small workload on neuron and exports its Chrome trace to trace_path."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 256, device="neuron")
    y = torch.randn(128, 64, device="neuron")
    f = torch.compile(lambda t: torch.nn.functional.gelu(t @ t.T) * 0.5 + 1, backend="neuron")

    def step() -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.kthvalue(x, 5, 1)  # runs through the CPU fallback
        f(x)

    step()  # compile and warm up outside the profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], record_shapes=True) as prof:
        step()
        torch.neuron.synchronize()
    prof.export_chrome_trace(trace_path)
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=15))


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="TRACE.json OUT.png, or OUT.png with --demo")
    ap.add_argument("--demo", action="store_true", help="profile a small workload and render its trace")
    ap.add_argument("--trace", default="neuron_trace.json", help="with --demo: where to write the trace")
    ap.add_argument("--start-ms", type=float, default=None)
    ap.add_argument("--end-ms", type=float, default=None)
    ap.add_argument("--title", default="")
    a = ap.parse_args(argv)
    if a.demo:
        demo(a.trace)
        trace, png = a.trace, a.paths[0]
    else:
        if len(a.paths) != 2:
            ap.error("expected TRACE.json OUT.png")
        trace, png = a.paths
    render(trace, png, a.title, a.start_ms, a.end_ms)
    print(f"wrote {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
