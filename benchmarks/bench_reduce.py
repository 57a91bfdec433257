"""RMS norm, softmax and sum/mean: neuron (native kernels) vs PyTorch CPU, measured in the same run.

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_reduce.py
Prints, per case, the median time of each device and ratio = cpu_time / neuron_time (>= 1: neuron is
at least as fast).
"""


import torch
import torch.nn.functional as F
from _timing import compare

import torch_neuronx  # noqa: F401


class LlamaRMSNorm(torch.nn.Module):
    """Hugging Face's LlamaRMSNorm: pow/mean/rsqrt in float32, the weight in the model dtype."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.variance_epsilon)
        return self.weight * h.to(dt)


def bench(name, make_fn):
    res = {}
    with torch.no_grad():
        res["neuron"], res["cpu"] = compare(make_fn("neuron"), make_fn("cpu"), sync=torch.neuron.synchronize)
    ratio = res["cpu"] / res["neuron"]
    print(f"{name:<44} cpu {res['cpu'] * 1e6:10.1f} us   neuron {res['neuron'] * 1e6:10.1f} us   ratio {ratio:5.2f}")
    return ratio


def main():
    torch.manual_seed(0)
    print(f"threads: {torch.get_num_threads()}")
    ratios = []
    for dtype in [torch.float32, torch.bfloat16]:
        tag = str(dtype).replace("torch.", "")
        for shape in [(1, 768), (512, 768), (8, 512, 768)]:
            x = torch.randn(shape, dtype=dtype)
            w = torch.randn(768, dtype=dtype)

            def hf(dev, x=x, w=w):
                m = LlamaRMSNorm(768).to(dev, dtype)
                m.weight.data.copy_(w)
                xd = x.to(dev)
                return lambda: m(xd)

            def frms(dev, x=x, w=w):
                xd, wd = x.to(dev), w.to(dev)
                return lambda: F.rms_norm(xd, (768,), wd, 1e-6)

            ratios.append(bench(f"LlamaRMSNorm {list(shape)} {tag}", hf))
            ratios.append(bench(f"F.rms_norm {list(shape)} {tag}", frms))
        for shape in [(8, 12, 512, 512), (1, 12, 1, 512)]:
            x = torch.randn(shape, dtype=dtype)

            def sm(dev, x=x):
                xd = x.to(dev)
                return lambda: torch.softmax(xd, -1)

            ratios.append(bench(f"softmax {list(shape)} {tag}", sm))
        x = torch.randn(4096, 4096, dtype=dtype)

        def s(dev, x=x):
            xd = x.to(dev)
            return lambda: xd.sum(-1)

        def mn(dev, x=x):
            xd = x.to(dev)
            return lambda: xd.mean(-1)

        def s0(dev, x=x):
            xd = x.to(dev)
            return lambda: xd.sum(0)  # a bias gradient's reduction

        def amax(dev, x=x):
            xd = x.to(dev)
            return lambda: xd.amax(-1)

        ratios.append(bench(f"sum(-1) [4096, 4096] {tag}", s))
        ratios.append(bench(f"mean(-1) [4096, 4096] {tag}", mn))
        ratios.append(bench(f"sum(0) [4096, 4096] {tag}", s0))
        ratios.append(bench(f"amax(-1) [4096, 4096] {tag}", amax))
    geo = 1.0
    for r in ratios:
        geo *= r
    print(f"geometric mean ratio: {geo ** (1 / len(ratios)):.2f}  (min {min(ratios):.2f})")


if __name__ == "__main__":
    main()
