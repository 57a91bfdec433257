"""Collectives on neuron (shared memory) vs Gloo (CPU tensors), 2 ranks by default, one run:

    python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/bench_collectives.py

(started directly, ``python benchmarks/bench_collectives.py [--nproc 4] [--sizes 4K,1M,64M] [--bw GBS]
[--json out.json]`` runs that command itself).

Prints all_reduce latency at 4 KiB and bus bandwidth at 64 MiB, all_gather and reduce_scatter bus
bandwidth at 64 MiB, for neuron and Gloo measured in the same run, and single-thread memcpy bandwidth;
then the bus bandwidth of the three across message sizes against the memory bound.
Bus bandwidth follows the usual convention: all_reduce moves 2(n-1)/n of the buffer per rank,
all_gather and reduce_scatter (n-1)/n of the full buffer.

Memory bound: whatever the algorithm, each rank must read R and write W bytes (S the buffer, n ranks, zero-copy):
all_reduce R = S, W = S (its slice of every input, the sum into that slice of every output); all_gather
R = S/n, W = S; reduce_scatter R = S, W = S/n. All n ranks share the machine's memory, so a call takes at least
n (R + W) / BW, BW the copy bandwidth (bytes read + written per second by a device copy between buffers past the
LLC: benchmarks/machine.py; --bw, else measured by rank 0 first): traffic that reads and writes at once. The
read-only probe's figure is lower (two cores' reads are limited by their outstanding misses, while a copy's
streaming stores add bandwidth), and collectives beat it. Buffers that fit in the last-level
cache together (2 ranks x 64 MiB in and out = 256 MiB) are not bound by it: the share can pass 100% there.
"""

import os
import sys
import time

def _opts(argv):
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M", help="message sizes of the bandwidth sweep")
    ap.add_argument("--bw", type=float, default=None, help="copy bandwidth (read + written) in GB/s (default: measured by rank 0)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-dram", dest="dram", action="store_false",
                    help="skip the size whose buffers pass 4x the LLC (the only one the memory bound holds for)")
    return ap.parse_args(argv)


OPTS = _opts(sys.argv[1:])
if "RANK" not in os.environ:
    # Started directly: run it as documented, --nproc ranks under torchrun.
    # The ranks do not need --nproc (WORLD_SIZE tells them), and torchrun would take it for an
    # abbreviation of its own --nproc-per-node and stop.
    rest, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith("--nproc="):
            skip = False
            continue
        if arg == "--nproc":
            skip = True
            continue
        rest.append(arg)
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc_per_node={OPTS.nproc}", os.path.abspath(__file__)] + rest)

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
DEV = torch.device("neuron", int(os.environ["LOCAL_RANK"]))


def timed(fn, iters, group, warmup=3):
    """Median over iterations of the slowest rank's time for one call. Each call starts after a barrier of
    the group under test; the median (the same statistic for both backends) keeps one preempted
    iteration of this shared 2-core host from deciding the result."""
    for _ in range(warmup):
        fn()
    ts = torch.empty(iters, dtype=torch.float64)
    for i in range(iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        ts[i] = time.perf_counter() - t0
    # The slowest rank defines the collective's time.
    dist.all_reduce(ts, op=dist.ReduceOp.MAX, group=CPU_GROUP)
    return ts.median().item()


def bench(device, group):
    small = torch.ones(1024, device=device)  # 4 KiB float32
    n = 16 * 1024 * 1024  # 64 MiB float32
    big = torch.ones(n, device=device)
    gather_out = torch.empty(n, device=device)
    shard = torch.ones(n // WORLD, device=device)
    res = {}
    res["all_reduce 4 KiB latency (us)"] = timed(lambda: dist.all_reduce(small, group=group), 2000 if device != "cpu" else 300, group) * 1e6
    t = timed(lambda: dist.all_reduce(big, group=group), 20, group)
    res["all_reduce 64 MiB busbw (GB/s)"] = 4 * n * 2 * (WORLD - 1) / WORLD / t / 1e9
    t = timed(lambda: dist.all_gather_into_tensor(gather_out, shard, group=group), 20, group)
    res["all_gather 64 MiB busbw (GB/s)"] = 4 * n * (WORLD - 1) / WORLD / t / 1e9
    t = timed(lambda: dist.reduce_scatter_tensor(shard, big, group=group), 20, group)
    res["reduce_scatter 64 MiB busbw (GB/s)"] = 4 * n * (WORLD - 1) / WORLD / t / 1e9
    return res


def parse_size(t):
    t = t.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(t[:-1]) * mult[t[-1]] if t[-1] in mult else int(t)


def human(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


# Per rank (read, write, bus bytes) as multiples of S for n ranks (see the docstring).
def rank_traffic(op, n):
    return {"all_reduce": (1.0, 1.0, 2 * (n - 1) / n), "all_gather": (1.0 / n, 1.0, (n - 1) / n),
            "reduce_scatter": (1.0, 1.0 / n, (n - 1) / n)}[op]


def sweep(device, group, sizes):
    """{(op, bytes): seconds per call} over the message sizes."""
    out = {}
    for nbytes in sizes:
        n = max(WORLD, nbytes // 4 // WORLD * WORLD)
        big = torch.ones(n, device=device)
        full = torch.empty(n, device=device)
        shard = torch.ones(n // WORLD, device=device)
        iters = max(5, min(200, int(2e8 / max(nbytes, 1))))
        out[("all_reduce", nbytes)] = timed(lambda: dist.all_reduce(big, group=group), iters, group)
        out[("all_gather", nbytes)] = timed(lambda: dist.all_gather_into_tensor(full, shard, group=group), iters, group)
        out[("reduce_scatter", nbytes)] = timed(lambda: dist.reduce_scatter_tensor(shard, big, group=group), iters,
                                                group)
        del big, full, shard
    return out


def memcpy_bw(concurrent):
    """Single-thread copy bandwidth of a 64 MiB buffer (median of 20 copies): on rank 0 alone, or on every
    rank at once."""
    a = torch.ones(16 * 1024 * 1024)
    b = torch.empty_like(a)
    torch.set_num_threads(1)
    b.copy_(a)
    dist.barrier(group=CPU_GROUP)
    if not concurrent and RANK != 0:
        dist.barrier(group=CPU_GROUP)
        return 0.0
    ts = []
    for _ in range(20):
        t0 = time.perf_counter()
        b.copy_(a)
        ts.append(time.perf_counter() - t0)
    bw = 4 * a.numel() / sorted(ts)[len(ts) // 2] / 1e9
    if not concurrent:
        dist.barrier(group=CPU_GROUP)
    return bw


# The targets: bandwidth >= 10x Gloo and >= 50% of memcpy at 64 MiB; 4 KiB latency <= 0.2x Gloo's.
TARGET_VS_GLOO = 10.0
TARGET_VS_MEMCPY = 0.5
TARGET_LATENCY = 0.2


def verdict(ok, short):
    return "met" if ok else f"NOT met ({short})"


if __name__ == "__main__":
    torch.neuron.set_device(DEV)
    dist.init_process_group("neuron")
    CPU_GROUP = dist.new_group(backend="gloo")
    gloo = bench("cpu", CPU_GROUP)
    neuron = bench(DEV, None)
    mc = memcpy_bw(concurrent=False)
    mc_all = torch.tensor([memcpy_bw(concurrent=True)], dtype=torch.float64)
    dist.all_reduce(mc_all, op=dist.ReduceOp.MIN, group=CPU_GROUP)
    mc_all = mc_all.item()
    if RANK == 0:
        print(f"{WORLD} ranks")
        print(f"{'':38s} {'neuron':>10s} {'gloo':>10s} {'neuron/gloo':>12s}  target")
        for k in neuron:
            r = neuron[k] / gloo[k]
            if "latency" in k:
                tgt = f"<= {TARGET_LATENCY}x: " + verdict(r <= TARGET_LATENCY, f"{r / TARGET_LATENCY:.1f}x too slow")
            else:
                tgt = f">= {TARGET_VS_GLOO:.0f}x: " + verdict(r >= TARGET_VS_GLOO, f"{TARGET_VS_GLOO / r:.1f}x short")
            print(f"{k:38s} {neuron[k]:10.2f} {gloo[k]:10.2f} {r:11.3f}x  {tgt}")
        print(f"single-thread memcpy 64 MiB: {mc:.2f} GB/s alone, {mc_all:.2f} GB/s per rank with all {WORLD} ranks copying at once")
        for k in neuron:
            if "busbw" in k:
                r = neuron[k] / mc
                print(f"{k}: {100 * r:.0f}% of memcpy  (target >= {100 * TARGET_VS_MEMCPY:.0f}%: "
                      f"{verdict(r >= TARGET_VS_MEMCPY, f'{TARGET_VS_MEMCPY / r:.1f}x short')})")
        # Memory bounds. Whatever the algorithm, each rank must read and write at least (zero-copy, n ranks,
        # S = 64 MiB): all_reduce reads S, writes S; all_gather reads S/n, writes S (its part into every
        # output); reduce_scatter reads S (its slice of every input), writes S/n. A copy of B bytes reads B
        # and writes B, so an op moving that much cannot beat the copy bandwidth the ranks get when they all
        # copy at once (non-temporal stores may win a little: they skip the read-for-ownership).
        S, n = 1.0, WORLD
        traffic = {"all_reduce": (S, S, 2 * (n - 1) / n * S), "all_gather": (S / n, S, (n - 1) / n * S),
                   "reduce_scatter": (S, S / n, (n - 1) / n * S)}
        for op, (rd, wr, bus) in traffic.items():
            k = f"{op} 64 MiB busbw (GB/s)"
            bound = mc_all * bus / ((rd + wr) / 2)
            need = TARGET_VS_GLOO * gloo[k]
            print(f"{op} 64 MiB copy-traffic bound {bound:.2f} GB/s busbw (plain-store copy): neuron at {100 * neuron[k] / bound:.0f}% of it; "
                  f"10x Gloo needs {need:.2f} GB/s = {need / bound:.1f}x the bound; 50% of memcpy needs "
                  f"{TARGET_VS_MEMCPY * mc:.2f} GB/s = {TARGET_VS_MEMCPY * mc / bound:.1f}x the bound")
    # Bandwidth across message sizes against the memory bound (issue 27).
    sizes = [parse_size(t) for t in OPTS.sizes.split(",") if t]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import machine
    llc = machine.llc_bytes()
    # The smallest power of two whose buffers (n ranks, input and output) pass 4x the LLC: the first size the
    # memory bound holds for.
    dram = 1 << 20
    while WORLD * 2 * dram < 4 * llc:
        dram *= 2
    if OPTS.dram and dram not in sizes:
        sizes.append(dram)
    bw = OPTS.bw
    if bw is None:
        bwt = torch.zeros(1, dtype=torch.float64)
        if RANK == 0:
            bwt[0] = machine.copy_bandwidth()[0]
        dist.broadcast(bwt, 0, group=CPU_GROUP)
        bw = bwt.item()
    sw_gloo = sweep("cpu", CPU_GROUP, sizes)
    sw_neuron = sweep(DEV, None, sizes)
    if RANK == 0:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _results import Results, short_by
        res = Results("collectives")
        res.meta.update(ranks=WORLD, read_bw_gbs=bw)
        print(f"\nbus bandwidth (GB/s) across sizes, {WORLD} ranks; bound = bus bytes / (n (R + W) / {bw:.1f} GB/s)")
        print(f"{'op':15s} {'size':>8s} {'neuron':>8s} {'gloo':>8s} {'bound':>8s} {'share':>6s}")
        lat = neuron["all_reduce 4 KiB latency (us)"]
        res.add(f"{WORLD} ranks", "all_reduce 4 KiB latency", lat, "us", ref=gloo["all_reduce 4 KiB latency (us)"],
                ref_name="Gloo", higher=False, target="<= 10 us", met=lat <= 10, miss=short_by(lat, 10, False) or None,
                ranks=WORLD)
        for (op, nbytes), t in sw_neuron.items():
            rd, wr, bus = rank_traffic(op, WORLD)
            busbw = bus * nbytes / t / 1e9
            gbus = bus * nbytes / sw_gloo[(op, nbytes)] / 1e9
            bound = bus * nbytes / (WORLD * (rd + wr) * nbytes / (bw * 1e9)) / 1e9
            resident = WORLD * 2 * nbytes < 4 * llc
            big = nbytes >= 64 << 20
            miss = short_by(busbw / bound, 0.8) if big and not resident else ""
            target = None
            if big:
                target = (">= 80% of bound" if not resident else
                          ">= 80% of bound: does not apply, the buffers are cache-resident (n x 2 x S < 4x LLC)")
            res.add(f"{WORLD} ranks", f"{op} {human(nbytes)}", busbw, "GB/s busbw", ref=gbus, ref_name="Gloo",
                    bound=None if resident else bound, bound_name=None if resident else "n (R + W) at copy bandwidth",
                    target=target, met=(not miss) if big and not resident else None, miss=miss or None, op=op,
                    bytes=nbytes, ranks=WORLD, memory_bound=bound, resident=resident)
            print(f"{op:15s} {human(nbytes):>8s} {busbw:8.2f} {gbus:8.2f} {bound:8.2f} {busbw / bound:6.0%}"
                  f"{'  (cache-resident: bound does not hold)' if resident else ''}")
        res.write(OPTS.json)
    dist.destroy_process_group()
