"""neuron-top: live op calls/s, busy time and memory per NeuronCore and process, from the segments.

Curses on a terminal (q or Ctrl-C quits); plain text frames with --once / --iterations N or when stdout
is not a terminal. Ctrl-C, SIGHUP (closed terminal), SIGTERM and a closed pipe end it with status 0.
"""

import argparse
import json
import os
import signal
import sys
import time

from . import segments


def _fmt_bytes(n) -> str:
    from . import _fmt_bytes as f

    return f(n)


class Sampler:
    """Two consecutive reads of the segments give rates per (pid, physical core)."""

    def __init__(self):
        self.prev = {}

    def sample(self):
        now = time.time()
        rows = []
        current = {}
        for pid, seg in segments.read_all().items():
            t = seg["update_unix_ns"] / 1e9 or now
            for c in seg["cores"]:
                key = (pid, c["physical_index"])
                ops = c["native_ops"] + c["fallback_ops"]
                current[key] = (t, ops, c["busy_ns"])
                p = self.prev.get(key)
                rate = busy = 0.0
                if p is not None and t > p[0]:
                    rate = (ops - p[1]) / (t - p[0])
                    busy = (c["busy_ns"] - p[2]) / 1e9 / (t - p[0])
                if not (c["allocated"] or c["reserved"] or ops):
                    continue
                rows.append({"physical_core": c["physical_index"], "chip": c["chip"], "pid": pid,
                             "logical_index": c["logical_index"], "ops_per_s": max(rate, 0.0),
                             "busy_pct": max(0.0, min(100.0 * busy, 100.0 * (os.cpu_count() or 1))),
                             "ops_total": ops, "allocated": c["allocated"], "reserved": c["reserved"],
                             "capacity": c["capacity"], "cmdline": seg["cmdline"]})
        self.prev = current
        rows.sort(key=lambda r: (r["physical_core"], r["pid"]))
        return rows


def render(rows, width=120) -> list:
    stamp = time.strftime("%H:%M:%S")
    cores = sorted({r["physical_core"] for r in rows})
    lines = [f"neuron-top {stamp}   {len(cores)} NeuronCore(s) in use, {len({r['pid'] for r in rows})} process(es)",
             f"{'NC':>3} {'PID':>8} {'OPS/S':>10} {'BUSY':>6} {'MEMORY':>10} {'RESERVED':>10} {'CAPACITY':>10}  COMMAND"]
    for r in rows:
        line = (f"{r['physical_core']:>3} {r['pid']:>8} {r['ops_per_s']:>10.0f} {r['busy_pct']:>5.0f}% "
                f"{_fmt_bytes(r['allocated']):>10} {_fmt_bytes(r['reserved']):>10} {_fmt_bytes(r['capacity']):>10}  "
                f"{r['cmdline']}")
        lines.append(line[:width])
    if not rows:
        lines.append("  (no process is using a NeuronCore)")
    return lines


def _plain(args) -> int:
    s = Sampler()
    s.sample()
    frames = 1 if args.once else args.iterations
    for i in range(frames):
        time.sleep(args.interval)
        rows = s.sample()
        if args.json:
            print(json.dumps({"time": time.time(), "rows": rows}), flush=True)
        else:
            print("\n".join(render(rows, 200)) + "\n", flush=True)
    return 0


def _curses(args) -> int:
    import curses

    def loop(scr):
        curses.curs_set(0)
        scr.timeout(int(args.interval * 1000))
        s = Sampler()
        s.sample()
        while True:
            rows = s.sample()
            h, w = scr.getmaxyx()
            scr.erase()
            for y, line in enumerate(render(rows, w - 1)[: h - 1]):
                scr.addstr(y, 0, line, curses.A_BOLD if y == 1 else 0)
            scr.addstr(h - 1, 0, "q: quit"[: w - 1])
            scr.refresh()
            if scr.getch() in (ord("q"), ord("Q")):
                return 0

    return curses.wrapper(loop)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="neuron-top", description="live NeuronCore use per core and process")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    ap.add_argument("--once", action="store_true", help="print one frame (after one interval) and exit")
    ap.add_argument("--iterations", type=int, default=0, help="print N frames as text and exit")
    ap.add_argument("--json", action="store_true", help="frames as JSON lines (with --once/--iterations)")
    args = ap.parse_args(argv)

    def _quit(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGHUP, _quit)  # the terminal went away
    signal.signal(signal.SIGTERM, _quit)
    try:
        if args.once or args.iterations or args.json or not sys.stdout.isatty():
            if not (args.once or args.iterations):
                args.iterations = 1 << 62
            return _plain(args)
        return _curses(args)
    except KeyboardInterrupt:
        return 0
    except OSError:  # writes to a closed terminal
        return 0
