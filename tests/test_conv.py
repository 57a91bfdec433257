"""Native 2-D convolution (im2col + GEMM) against PyTorch CPU: forward and all three gradients, strides,
padding, dilation, groups, 1x1, non-contiguous inputs, bias or not, fp32/bf16/fp16, empty batches; and
the cases the kernel does not take (transposed, 1-D, float64) still equal CPU."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx

@pytest.fixture(autouse=True)
def _native_conv_kernel(monkeypatch):
    """The im2col kernel for every convolution it can take: without this, convolutions where PyTorch's CPU
    kernel (oneDNN) is faster run that kernel on device memory, and the native kernel would go untested."""
    monkeypatch.setenv("TORCH_NEURONX_CONV_NATIVE", "1")


TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
       torch.float16: dict(rtol=2e-3, atol=2e-3)}


def native(op):
    return torch_neuronx.op_counts().get(op, {}).get("native", 0)


def run(dtype, x, w, b, **kw):
    """(out, grads) on CPU in fp32 from the same dtype-rounded values, and on neuron in dtype."""
    res = {}
    for dev in ("cpu", "neuron"):
        xd = x.to(dtype).to(dev).detach().requires_grad_()
        wd = w.to(dtype).to(dev).detach().requires_grad_()
        bd = b.to(dtype).to(dev).detach().requires_grad_() if b is not None else None
        if dev == "cpu" and dtype != torch.float32:  # the reference: fp32 math on the same rounded inputs
            xd, wd = xd.detach().float().requires_grad_(), wd.detach().float().requires_grad_()
            bd = bd.detach().float().requires_grad_() if bd is not None else None
        out = F.conv2d(xd, wd, bd, **kw)
        g = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype).to(dev)
        out.backward(g)
        res[dev] = [out, xd.grad, wd.grad] + ([bd.grad] if bd is not None else [])
    return res


CASES = [
    dict(shape=(2, 3, 9, 11), oc=4, k=(3, 3), kw=dict(padding=1)),
    dict(shape=(1, 4, 8, 8), oc=6, k=(1, 1), kw={}),
    dict(shape=(3, 5, 6, 7), oc=4, k=(1, 1), kw={}),  # several images: one batched product
    dict(shape=(3, 4, 10, 7), oc=6, k=(3, 2), kw=dict(stride=(2, 1), padding=(0, 1))),
    dict(shape=(2, 6, 9, 9), oc=4, k=(3, 3), kw=dict(stride=2, padding=2, dilation=2, groups=2)),
    dict(shape=(1, 4, 7, 5), oc=4, k=(3, 3), kw=dict(padding=1, groups=4)),  # depthwise
    dict(shape=(2, 3, 6, 6), oc=5, k=(5, 5), kw=dict(padding="same")),
    dict(shape=(1, 2, 5, 5), oc=3, k=(5, 5), kw={}),  # a 1x1 output
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_forward_backward(case, dtype, bias):
    c = CASES[case]
    gen = torch.Generator().manual_seed(case)
    x = torch.randn(c["shape"], generator=gen)
    cin = c["shape"][1] // c["kw"].get("groups", 1)
    w = torch.randn((c["oc"], cin) + c["k"], generator=gen) * 0.3
    b = torch.randn(c["oc"], generator=gen) if bias else None
    before = native("aten::convolution_overrideable"), native("aten::convolution_backward_overrideable")
    res = run(dtype, x, w, b, **c["kw"])
    assert native("aten::convolution_overrideable") > before[0]
    assert native("aten::convolution_backward_overrideable") > before[1]
    for i, (got, want) in enumerate(zip(res["neuron"], res["cpu"])):
        assert got.device.type == "neuron" and got.dtype == dtype
        tol = dict(TOL[dtype])
        if i == 2 and dtype != torch.float32:
            # The weight gradient is rounded once per image where PyTorch's CPU does that (see below).
            tol = {key: v * c["shape"][0] for key, v in tol.items()}
        torch.testing.assert_close(got.cpu().float(), want.detach().float(), **tol)


def test_non_contiguous_inputs_and_grad_output():
    x = torch.randn(2, 8, 6, 10)
    w = torch.randn(4, 3, 3, 3)
    xs = x[:, 1:4, :, ::2]  # channel slice and a strided width
    for dev_x in (xs, x.to(memory_format=torch.channels_last)[:, :3]):
        ref = F.conv2d(dev_x, w, padding=1)
        got = F.conv2d(dev_x.to("neuron"), w.to("neuron"), padding=1)
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-4)
    # channels_last weight and a non-contiguous grad_output
    wl = w.to(memory_format=torch.channels_last)
    xn = xs.to("neuron").requires_grad_()
    wn = wl.to("neuron").requires_grad_()
    out = F.conv2d(xn, wn, padding=1)
    g = torch.randn(out.shape[::-1]).permute(3, 2, 1, 0)
    out.backward(g.to("neuron"))
    xc, wc = xs.clone().requires_grad_(), wl.clone().requires_grad_()
    F.conv2d(xc, wc, padding=1).backward(g)
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wn.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-4)


def test_empty_batch_and_module():
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(0, 3, 5, 5)
    assert conv.to("neuron")(x.to("neuron")).shape == (0, 4, 5, 5)
    conv_cpu = torch.nn.Conv2d(3, 4, 3, padding=1)
    conv_dev = torch.nn.Conv2d(3, 4, 3, padding=1).to("neuron")
    conv_dev.load_state_dict(conv_cpu.state_dict())
    x = torch.randn(2, 3, 7, 7)
    torch.testing.assert_close(conv_dev(x.to("neuron")).cpu(), conv_cpu(x), rtol=1e-4, atol=1e-4)


def test_cases_the_kernel_does_not_take_equal_cpu():
    x = torch.randn(2, 3, 9)
    w = torch.randn(4, 3, 3)
    torch.testing.assert_close(F.conv1d(x.to("neuron"), w.to("neuron"), padding=1).cpu(), F.conv1d(x, w, padding=1))
    x2, w2 = torch.randn(1, 4, 5, 5, dtype=torch.float64), torch.randn(4, 2, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(F.conv_transpose2d(x2.to("neuron"), w2.to("neuron"), stride=2).cpu(),
                               F.conv_transpose2d(x2, w2, stride=2))
    torch.testing.assert_close(F.conv2d(x2.to("neuron"), w2.transpose(0, 1).to("neuron")).cpu(),
                               F.conv2d(x2, w2.transpose(0, 1)))


def test_errors_match_cpu():
    x, w = torch.randn(1, 3, 4, 4), torch.randn(2, 4, 3, 3)  # channel mismatch
    with pytest.raises(RuntimeError) as cpu_err:
        F.conv2d(x, w)
    with pytest.raises(RuntimeError) as dev_err:
        F.conv2d(x.to("neuron"), w.to("neuron"))
    assert str(dev_err.value).split("\n")[0] == str(cpu_err.value).split("\n")[0]
    with pytest.raises(RuntimeError, match="Kernel size can't be greater than actual input size"):
        F.conv2d(torch.randn(1, 1, 2, 2).to("neuron"), torch.randn(1, 1, 3, 3).to("neuron"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_conv2d_weight_grad_rounds_like_cpu(dtype):
    # PyTorch's CPU accumulates a half-precision weight gradient over the batch either in fp32 (oneDNN,
    # where the CPU has the instructions) or in the dtype, one image at a time (its im2col kernel): the
    # neuron gradient follows whichever this CPU does, to within an ulp, with 16 images to tell them apart.
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(16, 4, 6, 6, generator=gen).to(dtype)
    w = torch.randn(8, 1, 3, 3, generator=gen).to(dtype)
    g = torch.randn(16, 8, 4, 4, generator=gen).to(dtype)
    grads = []
    for dev in ("cpu", "neuron"):
        wd = w.clone().to(dev).requires_grad_()
        F.conv2d(x.to(dev), wd, groups=4).backward(g.to(dev))
        grads.append(wd.grad.cpu().float())
    ulp = torch.finfo(dtype).eps * grads[0].abs().clamp_min(1.0)
    assert ((grads[1] - grads[0]).abs() <= ulp).all(), (grads[1] - grads[0]).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_default_picks_the_faster_kernel_and_equals_cpu(dtype, monkeypatch):
    """By default a 3x3 convolution with few output channels runs PyTorch's CPU kernel on device memory
    (no copies) where that kernel is fast: fp32 always, bf16/fp16 where the CPU runs them on oneDNN. Without
    oneDNN's instructions CPU's bf16/fp16 convolution is a reference loop 4-30x slower than the native kernel,
    which takes it. A 1x1 convolution always runs the native kernel. Each equals CPU."""
    monkeypatch.delenv("TORCH_NEURONX_CONV_NATIVE", raising=False)
    x, w = torch.randn(1, 8, 12, 12).to(dtype), (torch.randn(4, 8, 3, 3) * 0.2).to(dtype)
    onednn = {torch.float32: True, torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
              torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported()}[dtype]
    before = native("aten::convolution_overrideable")
    y = F.conv2d(x.to("neuron"), w.to("neuron"), padding=1)
    assert native("aten::convolution_overrideable") == before + (0 if onednn else 1)
    want = F.conv2d(x, w, padding=1)
    if onednn:
        torch.testing.assert_close(y.cpu(), want, rtol=0, atol=0)
    else:  # fp32 accumulation rounded once; CPU's loop may round differently: within one ulp
        torch.testing.assert_close(y.cpu().float(), want.float(), rtol=1e-2, atol=1e-2)
    before = native("aten::convolution_overrideable")
    w1 = (torch.randn(4, 8, 1, 1) * 0.2).to(dtype)
    F.conv2d(x.to("neuron"), w1.to("neuron"))
    assert native("aten::convolution_overrideable") == before + 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("geom", [(1, 16, 16, 20, 3, 1, 1, 1, 1), (2, 12, 8, 17, 3, 2, 1, 1, 1),
                                  (1, 16, 32, 15, 3, 1, 2, 2, 1), (1, 16, 16, 19, 5, 1, 2, 1, 4),
                                  (1, 8, 8, 31, 3, 1, 0, 1, 8)])
def test_onednn_route_hands_channels_last_and_equals_cpu(dtype, geom, monkeypatch):
    """Where CPU runs the dtype on oneDNN, a contiguous input's convolution is handed to it in channels-last
    (converted by the device's copy kernel; CPU would convert its channels-last result with its own slower copy):
    the values are CPU's bit for bit and the output contiguous, as CPU returns it."""
    if not {torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported,
            torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported}[dtype]():
        pytest.skip(f"CPU runs {dtype} convolutions without oneDNN here (the native kernel takes them)")
    monkeypatch.delenv("TORCH_NEURONX_CONV_NATIVE", raising=False)
    n, c, oc, h, k, s, p, d, g = geom
    x, w, b = torch.randn(n, c, h, h).to(dtype), (torch.randn(oc, c // g, k, k) * 0.2).to(dtype), torch.randn(oc).to(dtype)
    want = F.conv2d(x, w, b, s, p, d, g)
    got = F.conv2d(x.to("neuron"), w.to("neuron"), b.to("neuron"), s, p, d, g)
    assert got.is_contiguous() and want.is_contiguous()
    assert torch.equal(got.cpu(), want)


# ---- Winograd F(4x4, 3x3) (kernels/conv_winograd.c): fp32/bf16/fp16 3x3 stride-1 forwards ------------------

def _layout(x, form):
    """x (N, C, H, W) in another memory layout with the same values."""
    if form == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if form == "permuted":  # H and W swapped in memory: a transposed view
        return x.transpose(2, 3).contiguous().transpose(2, 3)
    if form == "sliced":  # every other channel and column of a wider tensor
        big = x.new_zeros(x.shape[0], 2 * x.shape[1], x.shape[2], 2 * x.shape[3])
        big[:, ::2, :, ::2] = x
        return big[:, ::2, :, ::2]
    return x


WINO_CASES = [  # (N, C, H, W, OC, padding)
    (1, 3, 5, 7, 5, 1), (2, 5, 9, 6, 3, 0), (1, 17, 13, 11, 17, 2), (3, 8, 16, 16, 16, 1),
    (1, 64, 19, 21, 70, 1), (2, 4, 3, 3, 6, 0), (1, 2, 4, 5, 3, (2, 0)),
]


@pytest.mark.parametrize("form", ["contiguous", "channels_last", "permuted", "sliced"])
@pytest.mark.parametrize("case", range(len(WINO_CASES)))
@pytest.mark.parametrize("bias", [True, False])
def test_winograd_forward_equals_cpu(case, form, bias):
    """Every fp32 3x3 stride-1 convolution runs Winograd under TORCH_NEURONX_CONV_NATIVE=1: odd sizes (tiles cut
    by the image's edge), odd channel counts, padding 0/1/2, batches, inputs in any strides; the output has
    CPU's memory format and values within the fp32 tolerance."""
    n, c, h, w_, oc, pad = WINO_CASES[case]
    gen = torch.Generator().manual_seed(case)
    x = torch.randn(n, c, h, w_, generator=gen)
    w = torch.randn(oc, c, 3, 3, generator=gen) / (9 * c) ** 0.5
    b = torch.randn(oc, generator=gen) if bias else None
    xf = _layout(x, form)
    before = native("aten::convolution_overrideable")
    with torch.no_grad():
        got = F.conv2d(xf.to("neuron"), w.to("neuron"), b.to("neuron") if bias else None, padding=pad)
        want = F.conv2d(xf, w, b, padding=pad)
    assert native("aten::convolution_overrideable") == before + 1
    assert got.is_contiguous(memory_format=torch.channels_last) == want.is_contiguous(
        memory_format=torch.channels_last)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("form", ["contiguous", "channels_last", "permuted", "sliced"])
@pytest.mark.parametrize("case", range(len(WINO_CASES)))
def test_winograd_half_forward_equals_cpu(case, form, dtype):
    """bf16/fp16 through Winograd: widened to fp32 in the transforms, computed in fp32, rounded once into the
    output, as CPU's convolution accumulates in fp32 and rounds once: within the dtype's tolerance of CPU's
    convolution of the same values, for the fp32 cases' shapes and layouts (bias every other case)."""
    n, c, h, w_, oc, pad = WINO_CASES[case]
    gen = torch.Generator().manual_seed(case)
    x = torch.randn(n, c, h, w_, generator=gen).to(dtype)
    w = (torch.randn(oc, c, 3, 3, generator=gen) / (9 * c) ** 0.5).to(dtype)
    b = torch.randn(oc, generator=gen).to(dtype) if case % 2 == 0 else None
    xf = _layout(x, form)
    before = native("aten::convolution_overrideable")
    with torch.no_grad():
        got = F.conv2d(xf.to("neuron"), w.to("neuron"), b.to("neuron") if b is not None else None, padding=pad)
        want = F.conv2d(xf, w, b, padding=pad)
    assert native("aten::convolution_overrideable") == before + 1
    assert got.dtype == dtype
    assert got.is_contiguous(memory_format=torch.channels_last) == want.is_contiguous(
        memory_format=torch.channels_last)
    torch.testing.assert_close(got.cpu().float(), want.float(), **TOL[dtype])


def test_winograd_channels_last_weight_groups_empty():
    """A channels-last weight (the output follows it to channels-last, as on CPU), groups (one Winograd
    convolution per group), an empty batch and no input channels."""
    gen = torch.Generator().manual_seed(7)
    x, w = torch.randn(2, 6, 10, 9, generator=gen), torch.randn(4, 6, 3, 3, generator=gen) * 0.2
    wc = w.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        got = F.conv2d(x.to("neuron"), wc.to("neuron"), padding=1)
        assert got.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(got.cpu(), F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4)
        wg, b = torch.randn(4, 3, 3, 3, generator=gen) * 0.2, torch.randn(4, generator=gen)
        torch.testing.assert_close(F.conv2d(x.to("neuron"), wg.to("neuron"), b.to("neuron"), padding=2, groups=2).cpu(),
                                   F.conv2d(x, wg, b, padding=2, groups=2), rtol=1e-4, atol=1e-4)
        e = F.conv2d(x[:0].to("neuron"), w.to("neuron"), padding=1)
        assert e.shape == (0, 4, 10, 9)
        z = torch.zeros(1, 0, 5, 5)
        y0 = F.conv2d(z.to("neuron"), torch.zeros(3, 0, 3, 3).to("neuron"), b[:3].to("neuron"), padding=1)
        torch.testing.assert_close(y0.cpu(), F.conv2d(z, torch.zeros(3, 0, 3, 3), b[:3], padding=1))


def test_winograd_accuracy_at_vae_width():
    """At a VAE decoder's 256 channels (scaled weights, as a trained network has), the transforms' rounding
    stays within the fp32 tolerance of CPU. F(4x4, 3x3) at the points 0, +-1, 1/2, -2 is measured 10-16x further
    from the float64 result than CPU's direct convolution (the usual 0, +-1, +-2 were 30-50x): bounded at 25x so
    a worse transform shows."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 256, 20, 20, generator=gen)
    w = torch.randn(256, 256, 3, 3, generator=gen) / (9 * 256) ** 0.5
    b = torch.randn(256, generator=gen)
    with torch.no_grad():
        got = F.conv2d(x.to("neuron"), w.to("neuron"), b.to("neuron"), padding=1).cpu()
        want = F.conv2d(x, w, b, padding=1)
        ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got.double() - ref).abs().max() <= 25 * max((want.double() - ref).abs().max().item(), 1e-6)


@pytest.mark.skipif(torch_neuronx._C._gemm_isa() == "generic", reason="Winograd is measured only with SIMD micro-kernels")
@pytest.mark.parametrize("form", ["contiguous", "channels_last"])
def test_default_takes_winograd_for_vae_like_shapes(form, monkeypatch):
    """By default an fp32 3x3 convolution with >= 64 channels and >= 64 output tiles (a VAE decoder's) runs the
    Winograd kernel (faster than oneDNN's direct kernel there), and so does a 16x16 image (16 tiles) with the
    transformed-weight cache on; a smaller image, or 16x16 with the cache off, stays on PyTorch's CPU kernel
    (bit-equal to CPU), and TORCH_NEURONX_CONV_WINOGRAD=0 turns it off."""
    monkeypatch.delenv("TORCH_NEURONX_CONV_NATIVE", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_CONV_WINOGRAD", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_WINOGRAD_CACHE_MB", raising=False)
    gen = torch.Generator().manual_seed(11)
    x = _layout(torch.randn(1, 64, 32, 32, generator=gen), form)
    w, b = torch.randn(64, 64, 3, 3, generator=gen) / 24, torch.randn(64, generator=gen)
    xn, wn, bn = x.to("neuron"), w.to("neuron"), b.to("neuron")
    with torch.no_grad():
        before = native("aten::convolution_overrideable")
        got = F.conv2d(xn, wn, bn, padding=1)
        assert native("aten::convolution_overrideable") == before + 1
        torch.testing.assert_close(got.cpu(), F.conv2d(x, w, b, padding=1), rtol=1e-4, atol=1e-4)
        mid, small = x[:, :, :16, :16], x[:, :, :8, :8]
        before = native("aten::convolution_overrideable")
        got = F.conv2d(mid.to("neuron"), wn, bn, padding=1)
        assert native("aten::convolution_overrideable") == before + 1
        torch.testing.assert_close(got.cpu(), F.conv2d(mid, w, b, padding=1), rtol=1e-4, atol=1e-4)
        for img, cache in ((small, None), (mid, "0")):
            if cache is not None:
                monkeypatch.setenv("TORCH_NEURONX_WINOGRAD_CACHE_MB", cache)
            before = native("aten::convolution_overrideable")
            got = F.conv2d(img.to("neuron"), wn, bn, padding=1)
            assert native("aten::convolution_overrideable") == before
            torch.testing.assert_close(got.cpu(), F.conv2d(img, w, b, padding=1), rtol=0, atol=0)
        monkeypatch.setenv("TORCH_NEURONX_CONV_WINOGRAD", "0")
        before = native("aten::convolution_overrideable")
        F.conv2d(xn, wn, bn, padding=1)
        assert native("aten::convolution_overrideable") == before


@pytest.mark.skipif(torch_neuronx._C._gemm_isa() == "generic", reason="Winograd is measured only with SIMD micro-kernels")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_default_takes_winograd_for_vae_like_half_shapes(dtype, monkeypatch):
    """By default a bf16/fp16 VAE-like 3x3 convolution (128 channels at 64x64) runs the Winograd kernel, with or
    without oneDNN's bf16/fp16 kernels on the CPU, within the dtype's tolerance of CPU."""
    monkeypatch.delenv("TORCH_NEURONX_CONV_NATIVE", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_CONV_WINOGRAD", raising=False)
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(1, 128, 64, 64, generator=gen).to(dtype)
    w, b = (torch.randn(128, 128, 3, 3, generator=gen) / 34).to(dtype), torch.randn(128, generator=gen).to(dtype)
    with torch.no_grad():
        before = native("aten::convolution_overrideable")
        got = F.conv2d(x.to("neuron"), w.to("neuron"), b.to("neuron"), padding=1)
        assert native("aten::convolution_overrideable") == before + 1
        torch.testing.assert_close(got.cpu().float(), F.conv2d(x, w, b, padding=1).float(), **TOL[dtype])


# ---- the transformed-weight cache (WinoCache in neuron_ops_conv.cpp) -------------------------------------

def _cache():
    entries, nbytes, hits, misses = torch_neuronx._C._winograd_cache_info()
    return dict(entries=entries, bytes=nbytes, hits=hits, misses=misses)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_winograd_cache_hits_equal_uncached_and_see_inplace_updates(dtype, monkeypatch):
    """A weight's second call reuses its transformed weight and gives the uncached bits; an in-place update
    (w.add_(1): the version counter) and a new weight in the same place are recomputed, never served stale."""
    torch_neuronx._C._winograd_cache_clear()
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(2, 16, 13, 11, generator=gen).to(dtype).to("neuron")
    w = (torch.randn(24, 16, 3, 3, generator=gen) / 12).to(dtype).to("neuron")
    b = torch.randn(24, generator=gen).to(dtype).to("neuron")

    def uncached():
        monkeypatch.setenv("TORCH_NEURONX_WINOGRAD_CACHE_MB", "0")
        y = F.conv2d(x, w, b, padding=1).cpu()
        monkeypatch.delenv("TORCH_NEURONX_WINOGRAD_CACHE_MB")
        return y

    with torch.no_grad():
        ref = uncached()
        c0 = _cache()
        assert c0["entries"] == 0
        first = F.conv2d(x, w, b, padding=1).cpu()
        c = _cache()
        assert c["entries"] == 1 and c["misses"] == c0["misses"] + 1
        second = F.conv2d(x, w, b, padding=1).cpu()
        assert _cache()["hits"] == c["hits"] + 1
        assert torch.equal(first, ref) and torch.equal(second, ref)
        w.add_(1)
        ref2 = uncached()
        c = _cache()
        got = F.conv2d(x, w, b, padding=1).cpu()
        assert _cache()["misses"] == c["misses"] + 1 and _cache()["entries"] == 1  # the old version's entry went
        assert torch.equal(got, ref2) and not torch.equal(got, ref)
        w.copy_((torch.randn(24, 16, 3, 3, generator=gen) / 12).to(dtype))  # load_state_dict's way
        ref3 = uncached()
        assert torch.equal(F.conv2d(x, w, b, padding=1).cpu(), ref3)
        # a view of the weight (another offset) is its own entry
        got = F.conv2d(x, w[8:], b[8:], padding=1).cpu()
        monkeypatch.setenv("TORCH_NEURONX_WINOGRAD_CACHE_MB", "0")
        assert torch.equal(got, F.conv2d(x, w[8:], b[8:], padding=1).cpu())


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_winograd_cache_sees_writes_behind_the_version_counter(layout):
    """`weight.data += delta` (PEFT's LoRA merge) and writes through another alias leave the weight's version
    counter alone: the cache's byte comparison still recomputes, so the convolution never uses a stale U."""
    torch_neuronx._C._winograd_cache_clear()
    gen = torch.Generator().manual_seed(22)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1)
    if layout == "channels_last":
        conv = conv.to(memory_format=torch.channels_last)
    conv = conv.to("neuron")
    x = torch.randn(1, 64, 40, 40, generator=gen).to("neuron")  # 100 output tiles: Winograd by default

    def want():
        return F.conv2d(x.cpu(), conv.weight.detach().cpu(), conv.bias.detach().cpu(), padding=1)

    with torch.no_grad():
        torch.testing.assert_close(conv(x).cpu(), want(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(conv(x).cpu(), want(), rtol=1e-4, atol=1e-4)
        assert _cache()["hits"] >= 1, "the second call is a hit"
        version = conv.weight._version
        conv.weight.data += 0.02  # the merge of a LoRA delta (outputs move by ~0.5)
        assert conv.weight._version == version
        torch.testing.assert_close(conv(x).cpu(), want(), rtol=1e-4, atol=1e-4)
        alias = conv.weight.data
        alias[3, 5, 1, 1] = -1.0  # one element, through an alias
        torch.testing.assert_close(conv(x).cpu(), want(), rtol=1e-4, atol=1e-4)
        assert _cache()["entries"] == 1  # the stale entries went


def test_winograd_cache_drops_freed_weights_and_stays_bounded(monkeypatch):
    """The entry of a freed weight goes (its storage expired), and the cache never holds more bytes than
    TORCH_NEURONX_WINOGRAD_CACHE_MB: least recently used entries are evicted."""
    torch_neuronx._C._winograd_cache_clear()
    x = torch.randn(1, 64, 12, 12).to("neuron")
    with torch.no_grad():
        w = (torch.randn(64, 64, 3, 3) / 24).to("neuron")
        F.conv2d(x, w, padding=1)
        assert _cache()["entries"] == 1
        del w
        assert _cache()["entries"] == 0 and _cache()["bytes"] == 0
        one = None
        monkeypatch.setenv("TORCH_NEURONX_WINOGRAD_CACHE_MB", "2")  # ~3 transformed 64x64 weights (~0.6 MB each)
        ws = [(torch.randn(64, 64, 3, 3) / 24).to("neuron") for _ in range(6)]
        for i, w in enumerate(ws):
            want = F.conv2d(x.cpu(), w.cpu(), padding=1)
            torch.testing.assert_close(F.conv2d(x, w, padding=1).cpu(), want, rtol=1e-4, atol=1e-4)
            c = _cache()
            one = one or c["bytes"] // c["entries"]
            assert c["bytes"] <= 2 << 20 and c["entries"] == min(i + 1, (2 << 20) // one)
        # the most recent weight is still there (a hit), the first was evicted (a miss)
        c = _cache()
        F.conv2d(x, ws[-1], padding=1)
        assert _cache()["hits"] == c["hits"] + 1
        F.conv2d(x, ws[0], padding=1)
        assert _cache()["misses"] == c["misses"] + 1 and _cache()["bytes"] <= 2 << 20
        monkeypatch.setenv("TORCH_NEURONX_WINOGRAD_CACHE_MB", "0")  # off: emptied, nothing kept
        F.conv2d(x, ws[1], padding=1)
        assert _cache()["entries"] == 0



@pytest.mark.skipif(torch_neuronx._C._gemm_isa() == "generic", reason="Winograd is measured only with SIMD micro-kernels")
@pytest.mark.parametrize("form", ["contiguous", "channels_last", "strided"])
def test_winograd_cache_admits_on_second_use(form, monkeypatch):
    """A weight the cache holds fewer than 4 of (here a 1 MB bound against a 64->64 weight's ~0.74 MB of U and
    copy) runs Winograd only on a transformed weight the cache serves: its first call takes the other route
    (PyTorch's CPU kernel, bit-equal), its second admits it; a one-off weight and a weight seen again after the
    admitted one was used since evict nothing; one whose previous sighting is older than the admitted one's last
    use takes its place."""
    monkeypatch.delenv("TORCH_NEURONX_CONV_NATIVE", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_CONV_WINOGRAD", raising=False)
    monkeypatch.setenv("TORCH_NEURONX_WINOGRAD_CACHE_MB", "1")
    torch_neuronx._C._winograd_cache_clear()
    gen = torch.Generator().manual_seed(23)
    x = torch.randn(1, 64, 16, 17, generator=gen)  # 20 output tiles
    if form == "strided":
        x = torch.randn(1, 64, 32, 17, generator=gen)[:, :, ::2]
    x = _layout(x, "channels_last") if form == "channels_last" else x
    ws = [torch.randn(64, 64, 3, 3, generator=gen) / 24 for _ in range(3)]
    b = torch.randn(64, generator=gen)
    xn, bn = x.to("neuron"), b.to("neuron")
    wn = [w.to("neuron") for w in ws]

    def call(i, winograd):
        before = native("aten::convolution_overrideable")
        got = F.conv2d(xn, wn[i], bn, padding=1).cpu()
        want = F.conv2d(x, ws[i], b, padding=1)
        assert native("aten::convolution_overrideable") == before + int(winograd), (i, winograd)
        if winograd:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=0)

    with torch.no_grad():
        call(0, False)  # first sight: remembered, nothing transformed
        assert _cache()["entries"] == 0
        call(0, True)  # second: admitted
        c = _cache()
        assert c["entries"] == 1
        call(0, True)
        assert _cache()["hits"] == c["hits"] + 1
        call(1, False)  # a one-off weight evicts nothing
        call(0, True)  # the admitted weight is used again ...
        call(1, False)  # ... so weight 1's second sighting does not evict it
        assert _cache()["entries"] == 1
        c = _cache()
        call(0, True)
        assert _cache()["hits"] == c["hits"] + 1
        call(2, False)
        call(2, True)  # weight 0 unused since weight 2 was last seen: weight 2 takes its place
        c = _cache()
        assert c["entries"] == 1 and c["bytes"] <= 1 << 20
        call(2, True)
        assert _cache()["hits"] == c["hits"] + 1
        call(0, False)  # evicted: seen again, not yet admitted
        monkeypatch.setenv("TORCH_NEURONX_WINOGRAD_CACHE_MB", "0")  # off: the other route every call
        call(2, False)
        call(2, False)


@pytest.mark.skipif(torch_neuronx._C._gemm_isa() == "generic", reason="Winograd is measured only with SIMD micro-kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_winograd_large_weight_on_its_second_use(dtype, monkeypatch):
    """C*OC past 640^2 (a UNet's 1280->1280 at 16x16) takes Winograd by default only cached, from its second call
    (every dtype, the default bound); the first runs its other route. A non-contiguous channels-last input."""
    monkeypatch.delenv("TORCH_NEURONX_CONV_NATIVE", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_CONV_WINOGRAD", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_WINOGRAD_CACHE_MB", raising=False)
    torch_neuronx._C._winograd_cache_clear()
    gen = torch.Generator().manual_seed(24)
    c = 641
    x = torch.randn(1, c, 18, 16, generator=gen)[:, :, 1:-1].contiguous(memory_format=torch.channels_last)
    x = x[:, :, :, 1:]  # 16x15, channels-last strides, not dense
    w = (torch.randn(c, c, 3, 3, generator=gen) / (9 * c) ** 0.5).to(dtype)
    b = torch.randn(c, generator=gen).to(dtype)
    x = x.to(dtype)
    xn, wn, bn = x.to("neuron"), w.to("neuron"), b.to("neuron")
    want = F.conv2d(x.float(), w.float(), b.float(), padding=1)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else TOL[dtype]
    with torch.no_grad():
        for i in range(3):
            got = F.conv2d(xn, wn, bn, padding=1).cpu()
            assert _cache()["entries"] == (0 if i == 0 else 1)
            torch.testing.assert_close(got.float(), want, **tol)
        assert _cache()["hits"] >= 1
    torch_neuronx._C._winograd_cache_clear()



# ---- few output channels (nk_conv2d_few_out, kernels/conv_direct.c) ----------------------------------------

def _form(x, form):
    if form == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if form == "strided":  # every other column of a wider image: no unit stride anywhere but channels
        wide = torch.zeros(*x.shape[:3], 2 * x.shape[3], dtype=x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    return x


@pytest.mark.skipif(torch_neuronx._C._gemm_isa() == "generic", reason="measured only with SIMD micro-kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("form", ["contiguous", "channels_last", "strided"])
def test_default_takes_the_direct_kernel_for_few_output_channels(dtype, form, monkeypatch):
    """A VAE decoder's conv_out (128 -> 3, 3x3) runs the direct kernel by default in every layout, within the
    dtype's tolerance of CPU (bf16/fp16 summed in fp32 and rounded once, as CPU's oneDNN kernel does)."""
    monkeypatch.delenv("TORCH_NEURONX_CONV_NATIVE", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_CONV_WINOGRAD", raising=False)
    gen = torch.Generator().manual_seed(31)
    x = _form(torch.randn(1, 128, 45, 67, generator=gen).to(dtype), form)
    w = (torch.randn(3, 128, 3, 3, generator=gen) / 34).to(dtype)
    b = torch.randn(3, generator=gen).to(dtype)
    with torch.no_grad():
        for bias in (b, None):
            before = native("aten::convolution_overrideable")
            got = F.conv2d(x.to("neuron"), w.to("neuron"), None if bias is None else bias.to("neuron"), padding=1)
            assert native("aten::convolution_overrideable") == before + 1
            want = F.conv2d(x, w, bias, padding=1)
            assert got.is_contiguous(memory_format=torch.channels_last) == want.is_contiguous(
                memory_format=torch.channels_last)
            torch.testing.assert_close(got.cpu().float(), want.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("geom", [
    dict(n=2, c=5, oc=1, hw=(9, 13), k=(3, 3), p=(1, 1), d=(1, 1)),
    dict(n=1, c=7, oc=8, hw=(11, 6), k=(5, 3), p=(2, 0), d=(1, 1)),
    dict(n=2, c=3, oc=5, hw=(17, 19), k=(3, 3), p=(0, 3), d=(2, 1)),
    dict(n=1, c=16, oc=4, hw=(40, 70), k=(1, 7), p=(0, 3), d=(1, 2)),
    dict(n=1, c=9, oc=2, hw=(5, 4), k=(2, 2), p=(1, 1), d=(1, 1)),
])
@pytest.mark.parametrize("form", ["contiguous", "channels_last", "strided"])
def test_direct_few_out_kernel_odd_shapes(dtype, geom, form, monkeypatch):
    """The direct kernel on odd geometries (kernel sizes, asymmetric padding, dilation, output channels 1-8, image
    edges narrower than a vector), input layouts, a channels-last and a non-contiguous weight, against CPU."""
    monkeypatch.setenv("TORCH_NEURONX_CONV_WINOGRAD", "0")  # with CONV_NATIVE=1: the direct kernel for these
    gen = torch.Generator().manual_seed(32)
    g = geom
    x = _form(torch.randn(g["n"], g["c"], *g["hw"], generator=gen).to(dtype), form)
    w = (torch.randn(g["oc"], g["c"], *g["k"], generator=gen) / (g["c"] * g["k"][0] * g["k"][1]) ** 0.5).to(dtype)
    b = torch.randn(g["oc"], generator=gen).to(dtype)
    weights = [w, w.contiguous(memory_format=torch.channels_last),
               torch.randn(g["c"], g["oc"], *g["k"], generator=gen).to(dtype).transpose(0, 1)]
    with torch.no_grad():
        for wt in weights:
            before = native("aten::convolution_overrideable")
            got = F.conv2d(x.to("neuron"), wt.to("neuron"), b.to("neuron"), padding=g["p"], dilation=g["d"])
            assert native("aten::convolution_overrideable") == before + 1
            want = F.conv2d(x.float(), wt.float(), b.float(), padding=g["p"], dilation=g["d"])
            tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else TOL[dtype]
            torch.testing.assert_close(got.cpu().float(), want, **tol)


def _cpu_flags():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from machine import cpu_flags  # the benchmarks' reading of /proc/cpuinfo

    return cpu_flags()


@pytest.mark.skipif(torch_neuronx._C._gemm_isa() != "avx512" or "amx_tile" in _cpu_flags(),
                    reason="the rule for AVX-512 CPUs without AMX (Zen 4: 256-bit FMA units, double-pumped)")
def test_fp32_im2col_route_on_avx512_without_amx(monkeypatch):
    """On an AVX-512 CPU without AMX, fp32 im2col + GEMM takes only >= 1024 output channels (1280 on a small
    image, where oneDNN's kernel is weight-bound); 256-640 channels run oneDNN's kernel (0.36-0.84x there)."""
    monkeypatch.delenv("TORCH_NEURONX_CONV_NATIVE", raising=False)
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(1, 64, 16, 16, generator=gen), torch.randn(256, 64, 3, 3, generator=gen) * 0.05
    with torch.no_grad():
        before = native("aten::convolution_overrideable")
        got = F.conv2d(x.to("neuron"), w.to("neuron"), stride=2, padding=1)
        assert native("aten::convolution_overrideable") == before
        torch.testing.assert_close(got.cpu(), F.conv2d(x, w, stride=2, padding=1), rtol=0, atol=0)
        w2 = torch.randn(1024, 64, 3, 3, generator=gen) * 0.05
        before = native("aten::convolution_overrideable")
        got = F.conv2d(x.to("neuron"), w2.to("neuron"), stride=2, padding=1)
        assert native("aten::convolution_overrideable") == before + 1
        torch.testing.assert_close(got.cpu(), F.conv2d(x, w2, stride=2, padding=1), rtol=1e-4, atol=1e-4)
