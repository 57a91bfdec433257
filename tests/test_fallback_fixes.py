"""Backend gaps found by the architecture sweep: each result equals PyTorch CPU (or CUDA's rule where CPU has none)."""
import pytest
import torch
import torch.nn.functional as F


def test_reduction_out_resized_by_cpu_kernel():
    # The CPU kernel resizes the empty out= tensor, then views it: the view must stay a CPU tensor.
    x = torch.randn(2, 3, 5)
    for fn in (lambda t, out: torch.sum(t, [-1], out=out), lambda t, out: torch.amax(t, [0, 2], out=out),
               lambda t, out: torch.logsumexp(t, [-1], out=out)):
        out = torch.empty(0, device="neuron")
        res = fn(x.to("neuron"), out)
        assert res is out and out.device.type == "neuron"
        torch.testing.assert_close(out.cpu(), fn(x, torch.empty(0)))
    torch.testing.assert_close(torch.logsumexp(x.to("neuron"), -1).cpu(), torch.logsumexp(x, -1))


@pytest.mark.parametrize("case", ["conv1d_depthwise", "conv2d", "conv_transpose1d"])
def test_convolution_forward_backward(case):
    torch.manual_seed(0)
    if case == "conv1d_depthwise":  # the causal short convolution of Mamba-style layers
        x, w, b = torch.randn(2, 6, 11), torch.randn(6, 1, 4), torch.randn(6)
        fn = lambda x, w, b: F.conv1d(x, w, b, padding=3, groups=6)  # noqa: E731
    elif case == "conv2d":
        x, w, b = torch.randn(2, 3, 9, 7), torch.randn(5, 3, 3, 2), torch.randn(5)
        fn = lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), dilation=(1, 2))  # noqa: E731
    else:
        x, w, b = torch.randn(2, 4, 7), torch.randn(4, 3, 3), None
        fn = lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, output_padding=1)  # noqa: E731
    cpu = [t.clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    dev = [t.to("neuron").requires_grad_() if t is not None else None for t in (x, w, b)]
    y_cpu, y_dev = fn(*cpu), fn(*dev)
    assert y_dev.device.type == "neuron"
    torch.testing.assert_close(y_dev.cpu(), y_cpu)  # native im2col + GEMM: another summation order
    g = torch.randn_like(y_cpu)
    y_cpu.backward(g)
    y_dev.backward(g.to("neuron"))
    for c, d in zip(cpu, dev):
        if c is not None:
            assert d.grad.device.type == "neuron"
            torch.testing.assert_close(d.grad.cpu(), c.grad)


def histc_reference(x, bins, lo, hi):
    """CUDA's histc rule for integer tensors, written out in Python."""
    vals = x.flatten().tolist()
    lo, hi = int(lo), int(hi)
    if lo == hi and vals:
        lo, hi = min(vals), max(vals)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    counts = [0] * bins
    for v in vals:
        if lo <= v <= hi:
            counts[min((v - lo) * bins // (hi - lo), bins - 1)] += 1
    return torch.tensor(counts, dtype=x.dtype)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("bins,lo,hi", [(8, 0, 7), (3, 0, 7), (5, -4, 20), (4, 0, 0), (7, 2.9, 11.5), (1, 0, 3)])
def test_histc_integer_like_cuda(dtype, bins, lo, hi):
    g = torch.Generator().manual_seed(bins)
    low = 0 if dtype == torch.uint8 else -6
    x = torch.randint(low, 25, (5, 7), generator=g, dtype=dtype)
    ref = histc_reference(x, bins, lo, hi)
    out = torch.histc(x.to("neuron"), bins=bins, min=lo, max=hi)
    assert out.device.type == "neuron" and out.dtype == dtype
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)
    # Strided input and an out= tensor that needs resizing.
    xt = x.to("neuron").t()
    res = torch.empty(0, dtype=dtype, device="neuron")
    torch.histc(xt, bins=bins, min=lo, max=hi, out=res)
    torch.testing.assert_close(res.cpu(), histc_reference(x.t(), bins, lo, hi), rtol=0, atol=0)


def test_histc_integer_edge_cases():
    empty = torch.empty(0, dtype=torch.int32, device="neuron")
    torch.testing.assert_close(torch.histc(empty, bins=3).cpu(), torch.zeros(3, dtype=torch.int32), rtol=0, atol=0)
    same = torch.full((4,), 5, dtype=torch.int64, device="neuron")  # range [4, 6]
    torch.testing.assert_close(torch.histc(same, bins=2).cpu(), torch.tensor([0, 4]), rtol=0, atol=0)
    moe_ids = torch.tensor([3, 0, 1, 3, 3, 2, 0], dtype=torch.int32)  # Transformers' MoE routing use
    torch.testing.assert_close(torch.histc(moe_ids.to("neuron"), bins=4, min=0, max=3).cpu(),
                               torch.tensor([2, 1, 1, 3], dtype=torch.int32), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(moe_ids.to("neuron"), bins=4, min=3, max=1)
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(moe_ids.to("neuron"), bins=0)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.histc(moe_ids.to("neuron"), bins=4, out=torch.empty(4, dtype=torch.int64, device="neuron"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_histc_floating_equals_cpu(dtype):
    x = torch.randn(100, dtype=torch.float32).to(dtype)
    for kw in (dict(bins=10), dict(bins=7, min=-1, max=1)):
        torch.testing.assert_close(torch.histc(x.to("neuron"), **kw).cpu(), torch.histc(x, **kw), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="not finite"):
        torch.histc(torch.tensor([1.0, float("inf")], device="neuron"), bins=4)


@pytest.mark.parametrize("loss", ["mse_loss", "smooth_l1_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_resizing_in_meta_warn_nothing(loss, reduction):
    """Their CPU meta function resizes the output to the elementwise shape and back: reached through .out with a
    0-dim output already allocated, CPU warned "An output with one or more elements was resized" on every call."""
    import warnings

    fn = getattr(torch.nn.functional, loss)
    a = torch.randn(4, 3, requires_grad=True)
    b = torch.randn(4, 3)
    an = a.detach().to("neuron").requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fn(an, b.to("neuron"), reduction=reduction)
        got.sum().backward()
    want = fn(a, b, reduction=reduction)
    want.sum().backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach())
    torch.testing.assert_close(an.grad.cpu(), a.grad)


def test_mode_out_runs_on_the_cpu_kernel():
    """mode.values is a composite that refuses devices other than CPU, CUDA and XPU: it runs on the CPU kernel."""
    x = torch.randint(0, 4, (5, 6)).float()
    v, i = torch.empty(0, device="neuron"), torch.empty(0, dtype=torch.long, device="neuron")
    r = torch.mode(x.to("neuron"), 1, out=(v, i))
    want = torch.mode(x, 1)
    assert r[0] is v and v.device.type == "neuron"
    assert torch.equal(v.cpu(), want.values) and torch.equal(i.cpu(), want.indices)
