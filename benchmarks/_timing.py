"""Timing shared by the benchmarks.

The host is shared and noisy: the same code runs 10-30% faster or slower for seconds at a time. Timing
neuron first and the CPU afterwards lets such a phase decide the ratio, so the two are measured in
alternating rounds (neuron, CPU, neuron, CPU, ...) and each gets the median of its rounds.

Between rounds both sides sit idle for GAP_S: after a parallel region PyTorch's OpenMP threads spin
for milliseconds (libgomp's default wait policy), and ours for about half a millisecond; a round that
starts right after the other side's took a core away from itself (a 512x2048x768 GEMM on neuron ran at
68-72% of the FMA peak instead of 88-91%).
"""

import statistics
import time

GAP_S = 0.05


def _noop():
    pass


def compare(fn_neuron, fn_cpu, budget_s=0.5, rounds=7, sync=None):
    """Seconds per call of fn_neuron and of fn_cpu: the median over `rounds` alternating rounds, each the
    mean of enough calls to fill budget_s over all rounds of both. sync (torch.neuron.synchronize) is
    called after every neuron call."""
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
            time.sleep(GAP_S)
            t0 = time.perf_counter()
            for _ in range(reps[i]):
                fn()
                sy()
            samples[i].append((time.perf_counter() - t0) / reps[i])
    return statistics.median(samples[0]), statistics.median(samples[1])
