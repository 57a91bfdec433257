"""SDPA and KV-cache update on neuron vs PyTorch CPU, measured in the same run.

Prints, per case, the neuron time, the CPU time and CPU/neuron (>1 means neuron is faster). Target (issue 27):
causal prefill of 2048 tokens >= 1.5x CPU.

    python benchmarks/bench_attention.py [--json out.json]
"""

import argparse

import torch
import torch.nn.functional as F
from _results import Results, add_json_arg, short_by
from _timing import compare

RES = Results("attention")
PREFILL_2K_VS_CPU = 1.5

import torch_neuronx  # noqa: F401


def row(name, tn, tc):
    print(f"{name:<48} neuron {tn * 1e3:9.3f} ms   cpu {tc * 1e3:9.3f} ms   cpu/neuron {tc / tn:6.2f}x", flush=True)


def sdpa_case(name, B, H, Lq, Lk, D, dtype, causal):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, Lq, D, generator=g).to(dtype)
    k = torch.randn(B, H, Lk, D, generator=g).to(dtype)
    v = torch.randn(B, H, Lk, D, generator=g).to(dtype)
    qn, kn, vn = q.to("neuron"), k.to("neuron"), v.to("neuron")
    sync = torch.neuron.synchronize
    (tn, tn_lo, tn_hi), (tc, tc_lo, tc_hi) = compare(
        lambda: F.scaled_dot_product_attention(qn, kn, vn, is_causal=causal),
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), 1.0, sync=sync, spread=True)
    row(name, tn, tc)
    tgt = miss = None
    if causal and Lq == 2048:
        tgt, miss = f">= {PREFILL_2K_VS_CPU}x CPU", short_by(tc / tn, PREFILL_2K_VS_CPU) or None
    RES.add(str(dtype).replace("torch.", ""), name, tn * 1e3, "ms", ref=tc * 1e3, ref_name="PyTorch CPU eager",
            higher=False, spread=(tn_lo * 1e3, tn_hi * 1e3), ref_spread=(tc_lo * 1e3, tc_hi * 1e3), target=tgt,
            met=None if tgt is None else not miss, miss=miss)


def main():
    ap = argparse.ArgumentParser()
    add_json_arg(ap)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for dtype in (torch.float32, torch.bfloat16):
        dt = str(dtype).replace("torch.", "")
        for lq in (512, 2048):
            sdpa_case(f"sdpa prefill B1 H12 L{lq} D64 causal {dt}", 1, 12, lq, lq, 64, dtype, True)
        for lk in (512, 1024, 2048):
            sdpa_case(f"sdpa decode  B1 H12 Lq1 Lk{lk} D64 {dt}", 1, 12, 1, lk, 64, dtype, False)
    for dtype in (torch.float32, torch.bfloat16):
        dt = str(dtype).replace("torch.", "")
        cache = torch.zeros(1, 12, 2048, 64, dtype=dtype)
        new = torch.randn(1, 12, 1, 64).to(dtype)
        pos = torch.tensor([1000])
        cn, nn_, pn = cache.to("neuron"), new.to("neuron"), pos.to("neuron")
        tn, tc = compare(lambda: cn.index_copy_(2, pn, nn_), lambda: cache.index_copy_(2, pos, new), 1.0,
                         sync=torch.neuron.synchronize)
        row(f"index_copy_ [1,12,2048,64] dim2 1 row {dt}", tn, tc)
    RES.write(args.json)


if __name__ == "__main__":
    main()
