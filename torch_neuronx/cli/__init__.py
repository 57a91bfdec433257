"""`python -m torch_neuronx [ls|top|check]`, `neuron-ls`, `neuron-top`: the device tools.

They read the statistics segments other processes publish (``segments.py``) and load the extension
in-process only to list the cores this environment sees, so a broken set-up is still reported.
"""

import argparse
import json
import os
import sys

from . import info, segments


def _fmt_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _used(core: dict) -> bool:
    return bool(core["reserved"] or core["allocated"] or core["native_ops"] or core["fallback_ops"])


def collect(all_processes: bool = False) -> dict:
    """Everything neuron-ls shows, as plain data (the --json output)."""
    cores, error = info.load_cores()
    segs = segments.read_all()
    by_physical = {c["physical_index"]: c for c in cores}
    for c in cores:
        c["processes"] = []
        c["allocated"] = c["reserved"] = 0
    processes = []
    for pid, seg in sorted(segs.items()):
        used = [c for c in seg["cores"] if all_processes or _used(c)]
        if not used and not all_processes:
            continue
        processes.append({"pid": pid, "cmdline": seg["cmdline"], "nc_config": seg["nc_config"],
                          "native_ops": seg["native_ops"], "fallback_ops": seg["fallback_ops"],
                          "cores": [{"logical_index": c["logical_index"], "physical_index": c["physical_index"],
                                     "allocated": c["allocated"], "reserved": c["reserved"],
                                     "peak_allocated": c["peak_allocated"], "native_ops": c["native_ops"],
                                     "fallback_ops": c["fallback_ops"], "busy_ns": c["busy_ns"]}
                                    for c in used]})
        for c in used:
            mine = by_physical.get(c["physical_index"])
            if mine is not None and mine["nc_config"] == seg["nc_config"]:
                mine["processes"].append({"pid": pid, "allocated": c["allocated"], "reserved": c["reserved"],
                                          "cmdline": seg["cmdline"]})
                mine["allocated"] += c["allocated"]
                mine["reserved"] += c["reserved"]
    return {"versions": info.versions(), "environment": info.environment(), "cores": cores,
            "cores_error": error, "processes": processes, "stats_dir": segments.stats_dir()}


def ls_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="neuron-ls", description="NeuronCores, their memory and the processes using them")
    ap.add_argument("--json", action="store_true", help="print the data as JSON")
    ap.add_argument("--all", action="store_true", help="also list processes that hold no memory and ran no op")
    args = ap.parse_args(argv)
    data = collect(all_processes=args.all)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    v = data["versions"]
    print("versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val is not None))
    env = {k: val for k, val in data["environment"].items() if val is not None}
    print("environment: " + (", ".join(f"{k}={val}" for k, val in env.items()) or "(defaults)"))
    if data["cores_error"]:
        print(f"cores: unavailable in this environment: {data['cores_error']}")
        print("       (`python -m torch_neuronx check` names the problem)")
    else:
        n = len(data["cores"])
        cfg = data["cores"][0]["nc_config"] if n else 0
        print(f"{n} logical NeuronCore(s), {cfg} physical core(s) each")
        print(f"{'NC':>3} {'CHIP':>4} {'PHYS NC':>8} {'MEMORY USED':>12} {'RESERVED':>11} {'CAPACITY':>11}  PROCESSES")
        for c in data["cores"]:
            phys = f"{c['physical_cores'][0]}-{c['physical_cores'][-1]}" if len(c["physical_cores"]) > 1 \
                else str(c["physical_cores"][0])
            procs = ", ".join(f"{p['pid']} ({_fmt_bytes(p['allocated'])})" for p in c["processes"]) or "-"
            print(f"{c['index']:>3} {c['chip']:>4} {phys:>8} {_fmt_bytes(c['allocated']):>12} "
                  f"{_fmt_bytes(c['reserved']):>11} {_fmt_bytes(c['capacity']):>11}  {procs}")
    if data["processes"]:
        print(f"{'PID':>8} {'CORES (physical)':>17} {'ALLOCATED':>11} {'OPS':>10}  COMMAND")
        for p in data["processes"]:
            where = ",".join(str(c["physical_index"]) for c in p["cores"]) or "-"
            alloc = sum(c["allocated"] for c in p["cores"])
            print(f"{p['pid']:>8} {where:>17} {_fmt_bytes(alloc):>11} {p['native_ops'] + p['fallback_ops']:>10}  "
                  f"{p['cmdline'][:80]}")
    else:
        print("no process is using a NeuronCore")
    return 0


def check_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_neuronx check", description="names what is wrong with the set-up")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    problems = info.check()
    if args.json:
        print(json.dumps({"ok": not problems, "problems": problems}, indent=2))
    elif not problems:
        print("ok: extension built for the installed torch, autoload on, environment valid")
    else:
        for p in problems:
            print(f"PROBLEM: {p['problem']}: {p['detail']}" + (f"\n  fix: {p['fix']}" if p["fix"] else ""))
    return 1 if problems else 0


def top_main(argv=None) -> int:
    from .top import main

    return main(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmds = {"ls": ls_main, "top": top_main, "check": check_main}
    if argv and argv[0] in cmds:
        return cmds[argv[0]](argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        print("usage: python -m torch_neuronx [ls|top|check] [--json] ...  (default: ls)")
        return 0
    return ls_main(argv)


def _entry(fn):
    try:
        sys.exit(fn())
    except BrokenPipeError:  # `neuron-ls | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


def neuron_ls():
    _entry(ls_main)


def neuron_top():
    _entry(top_main)


def cli():
    _entry(main)
