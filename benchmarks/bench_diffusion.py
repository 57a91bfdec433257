"""Diffusion on neuron vs PyTorch CPU, measured in the same run: seconds per image and the convolution and
attention shapes of Stable Diffusion's UNet/VAE and of Flux on their own.

Pipeline: a Flux pipeline with Flux.1's layer widths (hidden 3072 = 24 heads x 128, T5 width 4096, the 16-channel
VAE with 128/256/512/512 channels) but few blocks (default 1 double-stream + 1 single-stream), random weights,
prompt embeddings passed in, --size px, --steps steps. Modes: neuron eager vs CPU eager, and neuron compiled
(torch.compile(backend="neuron") of the transformer) vs CPU Inductor (the same on the CPU pipeline), each pair
timed in alternating rounds by _timing.compare. Ratios are CPU/neuron (>1: neuron faster).

    python benchmarks/bench_diffusion.py [--dtype auto|bf16|fp32] [--size 256] [--steps 4] [--only shapes|pipeline]
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from _timing import compare

import torch_neuronx  # noqa: F401

SYNC = torch.neuron.synchronize


def row(name, tn, tc, unit="ms"):
    k = 1e3 if unit == "ms" else 1.0
    print(f"{name:<56} neuron {tn * k:9.3f} {unit}   cpu {tc * k:9.3f} {unit}   cpu/neuron {tc / tn:6.2f}x",
          flush=True)
    return tc / tn


def conv_case(name, n, cin, cout, hw, k, dtype, budget):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, cin, hw, hw, generator=g).to(dtype)
    w = (torch.randn(cout, cin, k, k, generator=g) / (cin * k * k) ** 0.5).to(dtype)
    b = torch.randn(cout, generator=g).to(dtype)
    xn, wn, bn = x.to("neuron"), w.to("neuron"), b.to("neuron")
    p = k // 2
    with torch.no_grad():
        tn, tc = compare(lambda: F.conv2d(xn, wn, bn, padding=p), lambda: F.conv2d(x, w, b, padding=p), budget,
                         rounds=5, sync=SYNC)
    return row(name, tn, tc)


def attn_case(name, b, h, lq, lk, d, dtype, budget):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(dtype) for n in (lq, lk, lk))
    qn, kn, vn = q.to("neuron"), k.to("neuron"), v.to("neuron")
    with torch.no_grad():
        tn, tc = compare(lambda: F.scaled_dot_product_attention(qn, kn, vn),
                         lambda: F.scaled_dot_product_attention(q, k, v), budget, rounds=5, sync=SYNC)
    return row(name, tn, tc)


def shapes(dtype, budget):
    dt = str(dtype).replace("torch.", "")
    ratios = []
    print(f"-- conv2d (SD 1.5 UNet at 512 px with CFG: batch 2, 64x64 latents; SD VAE decoder at 256 px) {dt}")
    for n, cin, cout, hw, k in [(2, 320, 320, 64, 3), (2, 640, 640, 32, 3), (2, 1280, 1280, 16, 3),
                                (2, 320, 640, 32, 1), (1, 512, 512, 64, 3), (1, 256, 256, 128, 3),
                                (1, 128, 128, 256, 3), (1, 128, 3, 256, 3)]:
        ratios.append(conv_case(f"conv2d N{n} {cin}->{cout} {hw}x{hw} k{k} {dt}", n, cin, cout, hw, k, dtype, budget))
    print(f"-- attention (SD UNet self/cross, SD VAE mid-block, Flux joint at 512 px) {dt}")
    for b, h, lq, lk, d in [(2, 8, 4096, 4096, 40), (2, 8, 4096, 77, 40), (2, 8, 1024, 1024, 80),
                            (1, 1, 1024, 1024, 512), (1, 24, 1536, 1536, 128)]:
        ratios.append(attn_case(f"sdpa B{b} H{h} Lq{lq} Lk{lk} D{d} {dt}", b, h, lq, lk, d, dtype, budget))
    print(f"shapes: min cpu/neuron {min(ratios):.2f}x (target >= 1.0x)")


def flux_pipeline(dtype, layers, single_layers):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=layers,
                                         num_single_layers=single_layers, attention_head_dim=128,
                                         num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                                         guidance_embeds=True, axes_dims_rope=[16, 56, 56])
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        layers_per_block=2, norm_num_groups=32, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.1159, scaling_factor=0.3611)
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True),
                        vae=vae, text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                        transformer=transformer).to(dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline(dtype, size, steps, layers, single_layers, text_len):
    import copy

    dt = str(dtype).replace("torch.", "")
    cpu = flux_pipeline(dtype, layers, single_layers)
    neuron = copy.deepcopy(cpu).to("neuron")
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(1, text_len, 4096, generator=g).to(dtype)
    pooled = torch.randn(1, 768, generator=g).to(dtype)

    def run(pipe, device):
        with torch.no_grad():
            return pipe(prompt_embeds=emb.to(device), pooled_prompt_embeds=pooled.to(device), height=size,
                        width=size, num_inference_steps=steps, guidance_scale=3.5, output_type="np",
                        generator=torch.Generator("cpu").manual_seed(0)).images

    n_params = sum(p.numel() for p in cpu.transformer.parameters()) / 1e6
    print(f"-- Flux-width pipeline: transformer {layers}+{single_layers} blocks ({n_params:.0f}M params), "
          f"{size}x{size}, {steps} steps, text {text_len} tokens, {dt}")
    a, b = run(neuron, "neuron"), run(cpu, "cpu")
    print(f"image max abs diff neuron vs CPU {abs(a - b).max():.4f}", flush=True)
    tn, tc = compare(lambda: run(neuron, "neuron"), lambda: run(cpu, "cpu"), 0.0, rounds=3, sync=SYNC)
    eager = row(f"seconds per image, eager (CPU eager)", tn, tc, unit="s")

    eager_tr = (neuron.transformer, cpu.transformer)
    neuron.transformer = torch.compile(eager_tr[0], backend="neuron", dynamic=False)
    cpu.transformer = torch.compile(eager_tr[1], backend="inductor", dynamic=False)
    a, b = run(neuron, "neuron"), run(cpu, "cpu")  # compile both before timing
    print(f"compiled image max abs diff neuron vs CPU {abs(a - b).max():.4f}", flush=True)
    tn2, tc2 = compare(lambda: run(neuron, "neuron"), lambda: run(cpu, "cpu"), 0.0, rounds=3, sync=SYNC)
    compiled = row(f"seconds per image, compiled (CPU Inductor)", tn2, tc2, unit="s")
    print(f"neuron compiled vs neuron eager {tn / tn2:.2f}x; targets: eager >= 1.2x (got {eager:.2f}x), "
          f"compiled >= 1.0x (got {compiled:.2f}x)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                    help="auto: bf16 where PyTorch CPU runs bf16 convolutions on oneDNN, else fp32 (without it CPU's "
                         "bf16 convolution is a reference loop: 31 s for one SD UNet conv on a Zen 3)")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=1, help="double-stream blocks")
    ap.add_argument("--single-layers", type=int, default=1, help="single-stream blocks")
    ap.add_argument("--text-len", type=int, default=64)
    ap.add_argument("--only", choices=["shapes", "pipeline"])
    ap.add_argument("--budget", type=float, default=0.6, help="seconds of timed calls per shape (both sides)")
    a = ap.parse_args()
    if a.dtype == "auto":
        a.dtype = "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    os.environ.setdefault("TORCH_NEURONX_COMPILE_QUIET", "1")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, dtype {a.dtype}", flush=True)
    if a.only != "pipeline":
        shapes(dtype, a.budget)
    if a.only != "shapes":
        pipeline(dtype, a.size, a.steps, a.layers, a.single_layers, a.text_len)


if __name__ == "__main__":
    sys.exit(main())
