"""Timing shared by the benchmarks.

The host is shared and noisy: the same code runs 10-30% faster or slower for seconds at a time. Timing
neuron first and the CPU afterwards lets such a phase decide the ratio, so the two are measured in
alternating rounds (neuron, CPU, neuron, CPU, ...) and each gets the median of its rounds.

Each round starts with WARM_S of untimed calls, so neither side starts cold. While the kernels had a
pool of their own, PyTorch's OpenMP threads still spun for milliseconds after the CPU side's round and
took a core from the neuron side (a 512x2048x768 GEMM measured 68-72% of the FMA peak there instead of
88-91%); both now share PyTorch's pool, and the warm-up still keeps caches and threads warm. Idling
between rounds instead left them cold: a 3 ms GEMM timed in short rounds after 50 ms of sleep took 5-7 ms.
"""

import statistics
import time

WARM_S = 0.02


def _noop():
    pass


def compare(fn_neuron, fn_cpu, budget_s=0.5, rounds=7, sync=None, spread=False, sync_each=True):
    """Seconds per call of fn_neuron and of fn_cpu: the median over `rounds` alternating rounds, each the
    mean of enough calls to fill budget_s over all rounds of both (after its warm-up). sync
    (torch.neuron.synchronize) is called after every neuron call, or with sync_each=False once after each
    round's calls, still inside the timed span: a per-call cost measured the way a loop of eager ops
    runs, without a synchronize (0.36 us) in every call. spread=True: (median, min, max) each."""
    fns = (fn_neuron, fn_cpu)
    syncs = (sync or _noop, _noop)
    reps = []
    for fn, sy in zip(fns, syncs):
        fn()  # warm up: packs, pages, pool threads
        sy()
        t0 = time.perf_counter()
        fn()
        sy()
        one = max(time.perf_counter() - t0, 1e-7)
        reps.append(max(1, min(2000, int(budget_s / (2 * rounds) / one))))
    samples = ([], [])
    for _ in range(rounds):
        for i, (fn, sy) in enumerate(zip(fns, syncs)):
            t_warm = time.perf_counter() + WARM_S
            while True:
                fn()
                sy()
                if time.perf_counter() >= t_warm:
                    break
            t0 = time.perf_counter()
            if sync_each:
                for _ in range(reps[i]):
                    fn()
                    sy()
            else:
                for _ in range(reps[i]):
                    fn()
                sy()
            samples[i].append((time.perf_counter() - t0) / reps[i])
    if spread:
        return tuple((statistics.median(x), min(x), max(x)) for x in samples)
    return statistics.median(samples[0]), statistics.median(samples[1])


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (benchmarks name the machine they ran on)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"
