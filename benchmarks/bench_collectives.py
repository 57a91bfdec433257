"""Collectives on neuron (shared memory) vs Gloo (CPU tensors), 2 ranks, one run:

    python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/bench_collectives.py

(started directly, ``python benchmarks/bench_collectives.py`` runs that command itself).

Prints all_reduce latency at 4 KiB and bus bandwidth at 64 MiB, all_gather and reduce_scatter bus
bandwidth at 64 MiB, for neuron and Gloo measured in the same run, and single-thread memcpy bandwidth.
Bus bandwidth follows the usual convention: all_reduce moves 2(n-1)/n of the buffer per rank,
all_gather and reduce_scatter (n-1)/n of the full buffer.
"""

import os
import sys
import time

if "RANK" not in os.environ:
    # Started directly: run it as documented, 2 ranks under torchrun.
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                              os.path.abspath(__file__)] + sys.argv[1:])

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
    dist.destroy_process_group()
