"""Collectives on neuron (shared memory) vs Gloo (CPU tensors), 2 ranks, one run:

    python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/bench_collectives.py

Prints all_reduce latency at 4 KiB and bus bandwidth at 64 MiB, all_gather and reduce_scatter bus
bandwidth at 64 MiB, for neuron and Gloo measured in the same run, and single-thread memcpy bandwidth.
Bus bandwidth follows the usual convention: all_reduce moves 2(n-1)/n of the buffer per rank,
all_gather and reduce_scatter (n-1)/n of the full buffer.
"""

import os
import time

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
DEV = torch.device("neuron", int(os.environ["LOCAL_RANK"]))


def timed(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dist.barrier()
    dt = (time.perf_counter() - t0) / iters
    # The slowest rank defines the collective's time.
    t = torch.tensor([dt], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=CPU_GROUP)
    return t.item()


def bench(device, group):
    small = torch.ones(1024, device=device)  # 4 KiB float32
    n = 16 * 1024 * 1024  # 64 MiB float32
    big = torch.ones(n, device=device)
    gather_out = torch.empty(n, device=device)
    shard = torch.ones(n // WORLD, device=device)
    res = {}
    res["all_reduce 4 KiB latency (us)"] = timed(lambda: dist.all_reduce(small, group=group), 2000 if device != "cpu" else 300) * 1e6
    t = timed(lambda: dist.all_reduce(big, group=group), 10)
    res["all_reduce 64 MiB busbw (GB/s)"] = 4 * n * 2 * (WORLD - 1) / WORLD / t / 1e9
    t = timed(lambda: dist.all_gather_into_tensor(gather_out, shard, group=group), 10)
    res["all_gather 64 MiB busbw (GB/s)"] = 4 * n * (WORLD - 1) / WORLD / t / 1e9
    t = timed(lambda: dist.reduce_scatter_tensor(shard, big, group=group), 10)
    res["reduce_scatter 64 MiB busbw (GB/s)"] = 4 * n * (WORLD - 1) / WORLD / t / 1e9
    return res


def memcpy_bw():
    a = torch.ones(16 * 1024 * 1024)
    b = torch.empty_like(a)
    torch.set_num_threads(1)
    b.copy_(a)
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    return 4 * a.numel() / ((time.perf_counter() - t0) / 10) / 1e9


if __name__ == "__main__":
    torch.neuron.set_device(DEV)
    dist.init_process_group("neuron")
    CPU_GROUP = dist.new_group(backend="gloo")
    gloo = bench("cpu", CPU_GROUP)
    neuron = bench(DEV, None)
    mc = memcpy_bw() if RANK == 0 else 0.0
    if RANK == 0:
        print(f"{'':38s} {'neuron':>10s} {'gloo':>10s} {'ratio':>8s}")
        for k in neuron:
            ratio = gloo[k] / neuron[k] if "latency" in k else neuron[k] / gloo[k]
            print(f"{k:38s} {neuron[k]:10.2f} {gloo[k]:10.2f} {ratio:7.1f}x")
        print(f"single-thread memcpy 64 MiB: {mc:.2f} GB/s")
        for k in neuron:
            if "busbw" in k:
                print(f"{k}: {100 * neuron[k] / mc:.0f}% of memcpy")
    dist.destroy_process_group()
