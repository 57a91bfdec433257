"""Figures a benchmark hands to the report (benchmarks/report.py) besides its console output.

A benchmark started with --json PATH writes there one record per figure: the neuron number and its reference
measured in the same run, their spread over the repeats (min-max), the ratio (> 1: neuron better, whatever the
unit), the physical bound where one applies and the share of it reached, the target and how far it is missed.
"""
import json


def add_json_arg(parser):
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH (for benchmarks/report.py)")


class Results:
    def __init__(self, bench):
        self.bench = bench
        self.figures = []
        self.meta = {}

    def add(self, group, name, neuron, unit, *, ref=None, ref_name=None, higher=True, spread=None, ref_spread=None,
            bound=None, bound_name=None, target=None, met=None, miss=None, **extra):
        """One figure. higher: a larger value is better (throughput); else smaller (time, latency).
        spread / ref_spread: (min, max) over the repeats. bound: the physical limit in the same unit."""
        ratio = None
        if ref is not None and neuron and ref:
            ratio = neuron / ref if higher else ref / neuron
        share = None
        if bound:
            share = neuron / bound if higher else bound / neuron
        self.figures.append(dict(group=group, name=name, unit=unit, neuron=neuron, ref=ref, ref_name=ref_name,
                                 higher=higher, spread=list(spread) if spread else None,
                                 ref_spread=list(ref_spread) if ref_spread else None, ratio=ratio, bound=bound,
                                 bound_name=bound_name, share=share, target=target, met=met, miss=miss, **extra))

    def write(self, path):
        if not path:
            return
        with open(path, "w") as f:
            json.dump({"bench": self.bench, "meta": self.meta, "figures": self.figures}, f, indent=1)


def short_by(got, want, higher=True):
    """How far `got` misses `want`, as the text the report prints ("" when met)."""
    if got is None:
        return "not measured"
    if (got >= want) if higher else (got <= want):
        return ""
    return f"short by {want / got:.2f}x" if higher else f"{got / want:.2f}x over"
