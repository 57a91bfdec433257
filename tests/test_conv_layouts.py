"""Convolution in every layout against PyTorch CPU: conv1d/2d/3d and their transposes, every padding mode,
strides, dilations and groups, with inputs that are channels-last, permuted, sliced, expanded (stride 0)
or empty; forward, the input/weight/bias gradients and the output's memory format.

A 1x1 convolution of a channels-last or permuted input once raised an internal descriptor error (the
Qwen-Image VAE's attention projection): every case here runs both the native kernel's and the CPU
fallback's paths in each layout. A hypothesis sweep draws the geometry and layout at random."""
import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_neuronx  # noqa: F401

@pytest.fixture(autouse=True)
def _native_conv_kernel(monkeypatch):
    """The im2col kernel for every convolution it can take: without this, convolutions where PyTorch's CPU
    kernel (oneDNN) is faster run that kernel on device memory, and the native kernel would go untested."""
    monkeypatch.setenv("TORCH_NEURONX_CONV_NATIVE", "1")


TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}
LAYOUTS = ("contiguous", "channels_last", "permuted", "sliced", "expanded")


def laid_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x's values in the given memory layout (the same values, other strides)."""
    nd = x.dim()
    if layout == "contiguous":
        return x.contiguous()
    if layout == "channels_last":
        if nd == 4:
            return x.contiguous(memory_format=torch.channels_last)
        if nd == 5:
            return x.contiguous(memory_format=torch.channels_last_3d)
        return x.transpose(1, 2).contiguous().transpose(1, 2)  # 3-D: channels innermost
    if layout == "permuted":  # the spatial dims swapped in memory
        return x.transpose(-1, -2).contiguous().transpose(-1, -2) if nd >= 4 else x.transpose(0, 2).contiguous().transpose(0, 2)
    if layout == "sliced":  # every other element of a wider tensor in the last dim
        wide = torch.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype, device=x.device)
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "expanded":  # one image broadcast over the batch (stride 0); values differ from x
        return x[:1].expand(x.shape)
    raise ValueError(layout)


def make_module(nd, transposed, cin, cout, k, stride, padding, dilation, groups, bias, padding_mode, dtype, out_pad=0):
    cls = {(1, False): nn.Conv1d, (2, False): nn.Conv2d, (3, False): nn.Conv3d,
           (1, True): nn.ConvTranspose1d, (2, True): nn.ConvTranspose2d, (3, True): nn.ConvTranspose3d}[(nd, transposed)]
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
    if transposed:
        kw["output_padding"] = out_pad
    else:
        kw["padding_mode"] = padding_mode
    return cls(cin, cout, k, **kw).to(dtype)


def check(m: nn.Module, x: torch.Tensor, layout: str, dtype: torch.dtype):
    x = laid_out(x.to(dtype), layout)
    mn = _copy_to(m, "neuron")
    xc = x.detach().requires_grad_()
    xn = _same_layout_on_neuron(x).requires_grad_()
    assert xn.stride() == xc.stride()
    try:
        yc = m(xc)
    except RuntimeError as e:  # an invalid geometry: neuron raises what CPU raises
        with pytest.raises(type(e), match=_first_words(str(e))):
            mn(xn)
        return
    yn = mn(xn)
    assert yn.device.type == "neuron"
    assert yn.shape == yc.shape
    torch.testing.assert_close(yn.cpu(), yc, **TOL[dtype])
    if yc.dim() in (4, 5) and yc.numel() > 0:
        fmt = torch.channels_last if yc.dim() == 4 else torch.channels_last_3d
        assert yn.is_contiguous(memory_format=fmt) == yc.is_contiguous(memory_format=fmt), (yn.stride(), yc.stride())
    g = torch.linspace(-1, 1, yc.numel()).reshape(yc.shape).to(dtype)
    yc.backward(g)
    yn.backward(g.to("neuron"))
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, **TOL[dtype])
    for (name, pc), pn in zip(m.named_parameters(), mn.parameters()):
        torch.testing.assert_close(pn.grad.cpu(), pc.grad, **TOL[dtype], msg=lambda s: f"{name}: {s}")


def _first_words(msg: str) -> str:
    import re

    return re.escape(msg.split(".")[0][:40])


def _copy_to(m: nn.Module, device: str) -> nn.Module:
    import copy

    return copy.deepcopy(m).to(device)


def _same_layout_on_neuron(x: torch.Tensor) -> torch.Tensor:
    """x on neuron with x's strides (an expanded x stays expanded, a sliced one sliced)."""
    if 0 in x.stride() and x.numel() > 0:
        return x[:1].to("neuron").expand(x.shape)
    if x.is_contiguous():
        return x.to("neuron")
    base = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="neuron") if _dense(x) else None
    if base is not None:
        base.copy_(x)
        return base
    wide = torch.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype, device="neuron")
    wide[..., ::2] = x.to("neuron")
    return wide[..., ::2]


def _dense(x: torch.Tensor) -> bool:
    """Whether x's strides are a permutation of a dense layout (empty_strided can make them)."""
    order = sorted(range(x.dim()), key=lambda d: x.stride(d))
    expect = 1
    for d in order:
        if x.size(d) != 1 and x.stride(d) != expect:
            return False
        expect *= x.size(d)
    return True


SHAPES = {1: (3, 6, 11), 2: (2, 6, 7, 9), 3: (2, 4, 5, 6, 7)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 3])
def test_conv_every_layout(nd, k, layout):
    torch.manual_seed(nd * 10 + k)
    x = torch.randn(SHAPES[nd])
    m = make_module(nd, False, SHAPES[nd][1], 4, k, 1, 0 if k == 1 else 1, 1, 1, True, "zeros", torch.float32)
    check(m, x, layout, torch.float32)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "permuted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_pointwise_conv_of_an_attention_block(layout, dtype):
    """The VAE mid-block attention: [B, C, H, W] -> permute/reshape -> 1x1 projection."""
    torch.manual_seed(0)
    b, c, h, w = 1, 16, 6, 10
    proj = nn.Conv2d(c, c, 1).to(dtype)
    tokens = torch.randn(b, h * w, c)  # attention output in [B, HW, C]
    x = tokens.to(dtype).permute(0, 2, 1).reshape(b, c, h, w)  # non-contiguous, channels-last strides
    assert not x.is_contiguous()
    check(proj, x.float(), layout if layout != "contiguous" else "contiguous", dtype)
    yn = _copy_to(proj, "neuron")(tokens.to(dtype).to("neuron").permute(0, 2, 1).reshape(b, c, h, w))
    torch.testing.assert_close(yn.cpu(), proj(x), **TOL[dtype])


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced"])
def test_conv2d_padding_modes(padding_mode, layout):
    torch.manual_seed(1)
    m = make_module(2, False, 4, 6, 3, 2, 2, 1, 2, True, padding_mode, torch.float32)
    check(m, torch.randn(2, 4, 8, 9), layout, torch.float32)


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "permuted"])
def test_transposed_conv(nd, layout):
    torch.manual_seed(2)
    m = make_module(nd, True, SHAPES[nd][1], 4, 3, 2, 1, 1, 2, True, "zeros", torch.float32, out_pad=1)
    check(m, torch.randn(SHAPES[nd]), layout, torch.float32)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_empty_batch(layout):
    m = make_module(2, False, 3, 5, 3, 1, 1, 1, 1, True, "zeros", torch.float32)
    x = torch.randn(0, 3, 6, 6)
    xn = laid_out(x, layout).to("neuron")
    y = m.to("neuron")(xn)
    assert y.shape == (0, 5, 6, 6)


@st.composite
def conv_cases(draw):
    nd = draw(st.sampled_from([1, 2, 3]))
    groups = draw(st.sampled_from([1, 2]))
    cin = groups * draw(st.integers(1, 3))
    cout = groups * draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    stride = draw(st.integers(1, 2))
    dilation = draw(st.integers(1, 2))
    padding = draw(st.integers(0, 2))
    transposed = draw(st.booleans())
    spatial = tuple(draw(st.integers(dilation * (k - 1) + 1, dilation * (k - 1) + 5)) for _ in range(nd))
    batch = draw(st.integers(1, 2))
    layout = draw(st.sampled_from(LAYOUTS))
    bias = draw(st.booleans())
    out_pad = draw(st.integers(0, max(0, min(stride, dilation) - 1))) if transposed else 0
    return nd, groups, cin, cout, k, stride, dilation, padding, transposed, (batch, cin) + spatial, layout, bias, out_pad


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases())
def test_conv_property(case):
    nd, groups, cin, cout, k, stride, dilation, padding, transposed, shape, layout, bias, out_pad = case
    torch.manual_seed(0)
    m = make_module(nd, transposed, cin, cout, k, stride, padding, dilation, groups, bias, "zeros", torch.float32,
                    out_pad=out_pad)
    check(m, torch.randn(shape), layout, torch.float32)
