"""Native reductions, softmax, norms and nll_loss on neuron against PyTorch CPU."""

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx

DEV = "neuron"
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
HALF_FLOATS = [torch.float32, torch.bfloat16, torch.float16]


def tol(dtype):
    if dtype == torch.bfloat16:
        return dict(rtol=2e-2, atol=2e-2)
    if dtype == torch.float16:
        return dict(rtol=2e-3, atol=2e-3)
    if dtype == torch.float64:
        return dict(rtol=1e-10, atol=1e-10)
    return dict(rtol=1e-5, atol=1e-5)


def close(a, b, dtype=None, **kw):
    assert a.device.type == DEV, a.device
    a = a.cpu()
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    t = tol(dtype or b.dtype) if b.is_floating_point() else dict(rtol=0, atol=0)
    t.update(kw)
    torch.testing.assert_close(a, b, equal_nan=True, **t)


def native(op, fn):
    """Runs fn and checks that `op` ran natively (and not on the CPU fallback)."""
    torch_neuronx.reset_op_counts()
    r = fn()
    c = torch_neuronx.op_counts().get(op)
    assert c is not None and c["native"] >= 1 and c["fallback"] == 0, (op, torch_neuronx.op_counts())
    return r


def make(shape, dtype, noncontig=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    elif dtype == torch.bool:
        x = torch.randint(0, 2, shape, generator=g).bool()
    else:
        x = torch.randint(-50 if dtype.is_signed else 0, 50, shape, generator=g).to(dtype)
    if noncontig and x.dim() >= 2:
        x = x.transpose(0, -1).contiguous().transpose(0, -1)
    return x


def both(x):
    n = x.to(DEV)
    if not x.is_contiguous():
        n = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=DEV).copy_(x)
        assert n.stride() == x.stride()
    return x, n


SHAPES_DIMS = [((3, 5, 7), d) for d in [None, 0, 1, 2, -1, (0, 2), (1, 2), (0, 1, 2), ()]] + [
    ((1000,), 0),
    ((4, 1, 129), 2),
    ((2, 3, 4, 5), (1, 3)),
    ((), None),
]


@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("noncontig", [False, True])
def test_sum_mean(shape, dim, keepdim, noncontig):
    for dtype in FLOATS:
        c, n = both(make(shape, dtype, noncontig))
        if dim is None:
            close(native("aten::sum.IntList_out", lambda: n.sum()), c.sum())
            close(native("aten::mean.out", lambda: n.mean()), c.mean())
        else:
            close(native("aten::sum.IntList_out", lambda: n.sum(dim, keepdim)), c.sum(dim, keepdim))
            close(native("aten::mean.out", lambda: n.mean(dim, keepdim)), c.mean(dim, keepdim))
    for dtype in [torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool]:
        c, n = both(make(shape, dtype, noncontig))
        d = dim if dim is not None else list(range(c.dim()))
        close(native("aten::sum.IntList_out", lambda: n.sum(d, keepdim)), c.sum(d, keepdim))


def test_sum_mean_dtype_arg_and_large():
    c, n = both(make((64, 3000), torch.bfloat16))
    close(n.sum(1, dtype=torch.float32), c.sum(1, dtype=torch.float32))
    close(n.mean(1, dtype=torch.float32), c.mean(1, dtype=torch.float32))
    close(n.sum(0, dtype=torch.float64), c.sum(0, dtype=torch.float64))  # CPU fallback path
    c, n = both(make((300000,), torch.float32))
    close(native("aten::sum.IntList_out", lambda: n.sum()), c.sum(), rtol=1e-4, atol=1e-3)
    close(n.mean(), c.mean())
    c, n = both(make((5, 70000), torch.float32))
    close(n.sum(1), c.sum(1), rtol=1e-4, atol=1e-3)
    i, ni = both(make((3, 7), torch.int32))
    close(ni.sum(1, dtype=torch.float32), i.sum(1, dtype=torch.float32))
    out = torch.empty(3, device=DEV)
    torch.sum(n[:3, :10], 1, out=out)
    close(out, c[:3, :10].sum(1))
    out = torch.empty(7, device=DEV)  # wrong shape: resized like CPU (with its warning)
    with pytest.warns(UserWarning):
        torch.sum(n[:3, :10], 1, out=out)
    close(out, c[:3, :10].sum(1))


def test_reduce_empty_and_errors():
    c, n = both(torch.randn(0, 4))
    close(n.sum(0), c.sum(0))
    close(n.sum(1), c.sum(1))
    close(n.mean(0), c.mean(0))
    close(n.amax(1), c.amax(1))
    with pytest.raises(RuntimeError, match="Expected reduction dim"):
        c.max()
    with pytest.raises(RuntimeError, match="Expected reduction dim"):
        n.max()
    with pytest.raises(IndexError):
        n.amax(0)
    with pytest.raises(IndexError, match="out of range"):
        n.sum(5)
    with pytest.raises(RuntimeError):
        make((3,), torch.int64).to(DEV).mean()


NANS = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [2.0, 5.0, -1.0, 5.0], [float("-inf")] * 4])


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_min_arg(dtype):
    for shape in [(3, 5, 7), (2, 40), (1, 33), (5,), ()]:
        for noncontig in [False, True]:
            c, n = both(make(shape, dtype, noncontig))
            close(native("aten::max", lambda: n.max()), c.max())
            close(native("aten::min", lambda: n.min()), c.min())
            close(native("aten::argmax.out", lambda: n.argmax()), c.argmax())
            close(n.argmin(), c.argmin())
            for d in range(-c.dim(), max(c.dim(), 1)):
                for keep in [False, True]:
                    v, i = native("aten::max.dim_max", lambda: n.max(d, keep))
                    cv, ci = c.max(d, keep)
                    close(v, cv)
                    close(i, ci)
                    v, i = native("aten::min.dim_min", lambda: n.min(d, keep))
                    cv, ci = c.min(d, keep)
                    close(v, cv)
                    close(i, ci)
                    close(native("aten::argmax.out", lambda: n.argmax(d, keep)), c.argmax(d, keep))
                    close(native("aten::argmin.out", lambda: n.argmin(d, keep)), c.argmin(d, keep))
                    close(native("aten::amax.out", lambda: n.amax(d, keep)), c.amax(d, keep))
                    close(native("aten::amin.out", lambda: n.amin(d, keep)), c.amin(d, keep))
    c, n = both(make((3, 5, 7), dtype))
    close(n.amax((0, 2)), c.amax((0, 2)))
    close(n.amin((0, 2), True), c.amin((0, 2), True))
    # Ties: the first occurrence; NaN wins and its first index is returned.
    c, n = both(NANS.to(dtype))
    for d in [0, 1]:
        close(n.max(d)[0], c.max(d)[0])
        close(n.max(d)[1], c.max(d)[1])
        close(n.min(d)[1], c.min(d)[1])
        close(n.argmax(d), c.argmax(d))
        close(n.amax(d), c.amax(d))
    close(n.max(), c.max())
    close(n.argmax(), c.argmax())
    # Long rows (SIMD lanes) with ties and a late NaN.
    x = torch.zeros(3, 100, dtype=dtype)
    x[0, 17] = x[0, 80] = 1
    x[1, 95] = float("nan")
    x[2, 50] = -1
    c, n = both(x)
    for d in [0, 1]:
        close(n.argmax(d), c.argmax(d))
        close(n.argmin(d), c.argmin(d))
        close(n.amax(d), c.amax(d))


def test_max_ints_fallback():
    c, n = both(make((3, 5), torch.int64))
    close(n.max(), c.max())
    close(n.max(1)[1], c.max(1)[1])
    close(n.argmax(), c.argmax())
    close(n.amax(0), c.amax(0))


@pytest.mark.parametrize("dtype", FLOATS)
def test_var_std(dtype):
    for shape, dim in SHAPES_DIMS:
        if dim == ():
            continue
        for noncontig in [False, True]:
            c, n = both(make(shape, dtype, noncontig) * 3 + 10)
            for corr in [0, 1, 2.5]:
                for keep in [False, True]:
                    close(native("aten::var.correction", lambda: torch.var(n, dim, correction=corr, keepdim=keep)),
                          torch.var(c, dim, correction=corr, keepdim=keep))
                    close(native("aten::std.correction", lambda: torch.std(n, dim, correction=corr, keepdim=keep)),
                          torch.std(c, dim, correction=corr, keepdim=keep))
                    v, m = native("aten::var_mean.correction",
                                  lambda: torch.var_mean(n, dim, correction=corr, keepdim=keep))
                    cv, cm = torch.var_mean(c, dim, correction=corr, keepdim=keep)
                    close(v, cv)
                    close(m, cm)
                    s, m = native("aten::std_mean.correction",
                                  lambda: torch.std_mean(n, dim, correction=corr, keepdim=keep))
                    cs, cm = torch.std_mean(c, dim, correction=corr, keepdim=keep)
                    close(s, cs)
                    close(m, cm)
    c, n = both(torch.tensor([[1.0, 2.0, float("nan")], [1.0, 1.0, 1.0]], dtype=dtype))
    close(n.var(1), c.var(1))
    close(n.std(1, correction=5), c.std(1, correction=5))
    c, n = both(make((4, 100000), dtype) + 1000)
    close(n.var(1), c.var(1), **(dict(rtol=1e-3, atol=1e-3) if dtype == torch.float32 else {}))
    with pytest.raises(RuntimeError):
        make((3,), torch.int64).to(DEV).var()


@pytest.mark.parametrize("dtype", FLOATS)
def test_logsumexp(dtype):
    for shape, dim in SHAPES_DIMS:
        if dim is None or dim == ():
            continue
        for keep in [False, True]:
            c, n = both(make(shape, dtype, True) * 5)
            close(native("aten::logsumexp", lambda: n.logsumexp(dim, keep)), c.logsumexp(dim, keep))
    x = torch.tensor([[1.0, float("inf")], [float("-inf")] * 2, [float("nan"), 1.0], [-1000.0, -1000.0]], dtype=dtype)
    c, n = both(x)
    close(n.logsumexp(1), c.logsumexp(1))
    c, n = both(torch.arange(6).reshape(2, 3))
    close(n.logsumexp(1), c.logsumexp(1))


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_cumsum(dtype):
    for shape in [(3, 5, 7), (100,), ()]:
        for noncontig in [False, True]:
            c, n = both(make(shape, dtype, noncontig))
            for d in range(-max(c.dim(), 1), max(c.dim(), 1)):
                close(native("aten::cumsum.out", lambda: n.cumsum(d)), c.cumsum(d))
    c, n = both(make((4, 9), dtype))
    if dtype.is_floating_point:
        close(n.cumsum(1, dtype=torch.float64), c.cumsum(1, dtype=torch.float64))
    else:
        close(n.cumsum(1, dtype=torch.int32), c.cumsum(1, dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.float32, torch.bfloat16, torch.int64, torch.float16])
def test_any_all(dtype):
    x = make((3, 5, 7), torch.float32)
    x = torch.where(x > 0.8, x, torch.zeros(()))
    x[0] = 0
    x[1, 2] = 1
    if dtype.is_floating_point:
        x[2, 0, 0] = float("nan")
        x[2, 1, 1] = -0.0
    x = x.to(dtype)
    for noncontig in [False, True]:
        c, n = both(x.transpose(0, 2).contiguous().transpose(0, 2) if noncontig else x)
        close(native("aten::any.all_out", lambda: n.any()), c.any())
        close(native("aten::all.all_out", lambda: n.all()), c.all())
        for d in [0, 1, 2, -1]:
            for keep in [False, True]:
                close(native("aten::any.out", lambda: n.any(d, keep)), c.any(d, keep))
                close(native("aten::all.out", lambda: n.all(d, keep)), c.all(d, keep))
        close(native("aten::any.dims_out", lambda: n.any((0, 2))), c.any((0, 2)))
        close(native("aten::all.dims_out", lambda: n.all((0, 2), True)), c.all((0, 2), True))
    c, n = both(torch.zeros(0, 3, dtype=dtype))
    close(n.any(0), c.any(0))
    close(n.all(0), c.all(0))


SOFTMAX_CASES = [((3, 5, 7), -1), ((3, 5, 7), 0), ((3, 5, 7), 1), ((2, 5000), 1), ((4, 33), 1), ((6,), 0), ((), 0)]


@pytest.mark.parametrize("dtype", HALF_FLOATS + [torch.float64])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(dtype, log):
    op = "aten::_log_softmax.out" if log else "aten::_softmax.out"
    fn = F.log_softmax if log else F.softmax
    for shape, dim in SOFTMAX_CASES:
        for noncontig in [False, True]:
            c, n = both(make(shape, dtype, noncontig) * 4)
            r = native(op, lambda: fn(n, dim)) if dtype != torch.float64 else fn(n, dim)
            close(r, fn(c, dim))
            if dtype in (torch.bfloat16, torch.float16):
                # half_to_float (CUDA-style; PyTorch CPU refuses it): equals the float computation.
                got = (torch.ops.aten._softmax if not log else torch.ops.aten._log_softmax)(n, dim, True)
                close(got, fn(c.float(), dim))
    x = torch.tensor([[1.0, float("nan"), 2.0], [float("-inf"), 0.0, 1.0], [float("inf"), 1.0, 1.0],
                      [float("-inf")] * 3], dtype=dtype)
    c, n = both(x)
    close(fn(n, 1), fn(c, 1))


@pytest.mark.parametrize("dtype", HALF_FLOATS)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward(dtype, log):
    fn = F.log_softmax if log else F.softmax
    op = "aten::_log_softmax_backward_data.out" if log else "aten::_softmax_backward_data.out"
    for shape, dim in SOFTMAX_CASES:
        c = make(shape, dtype).requires_grad_()
        n = c.detach().to(DEV).requires_grad_()
        g = make(shape, dtype, seed=1)
        fn(c, dim).backward(g)
        native(op, lambda: fn(n, dim).backward(g.to(DEV)))
        close(n.grad, c.grad)
    # half_to_float (float output and grads of a float16 input): a float16 input gradient.
    if dtype == torch.float16:
        y = fn(make((4, 9), dtype).float(), 1)
        g = make((4, 9), torch.float32, seed=2)
        bwd = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
        close(bwd(g.to(DEV), y.to(DEV), 1, dtype), bwd(g, y, 1, torch.float32).to(dtype))


@pytest.mark.parametrize("dtype", HALF_FLOATS)
def test_cross_entropy(dtype):
    for shape in [(5, 7), (3, 1000), (7,)]:
        C = shape[-1]
        tgt = torch.randint(0, C, shape[:-1], generator=torch.Generator().manual_seed(3))
        w = torch.rand(C, dtype=dtype) + 0.5
        for kw in [dict(), dict(reduction="sum"), dict(reduction="none"), dict(weight=w),
                   dict(weight=w, reduction="none"), dict(ignore_index=2), dict(label_smoothing=0.1)]:
            if len(shape) == 2:
                tgt[1] = kw.get("ignore_index", -100)
            c = make(shape, dtype).requires_grad_()
            n = c.detach().to(DEV).requires_grad_()
            kwn = {k: (v.to(DEV) if torch.is_tensor(v) else v) for k, v in kw.items()}
            lc = F.cross_entropy(c, tgt, **kw)
            torch_neuronx.reset_op_counts()
            ln = F.cross_entropy(n, tgt.to(DEV), **kwn)
            assert torch_neuronx.op_counts()["aten::nll_loss_forward.output"]["fallback"] == 0
            close(ln, lc.detach(), rtol=5e-2 if dtype != torch.float32 else 1e-5)
            g = torch.rand(lc.shape, dtype=dtype)
            lc.backward(g)
            ln.backward(g.to(DEV))
            close(n.grad, c.grad)


def test_nll_loss_direct():
    x = torch.randn(6, 5, dtype=torch.float64)
    t = torch.tensor([0, 4, -100, 2, 2, 1])
    w = torch.rand(5, dtype=torch.float64)
    for red in [0, 1, 2]:
        for wt in [None, w]:
            o, tw = torch.ops.aten.nll_loss_forward(x, t, wt, red, -100)
            on, twn = native("aten::nll_loss_forward.output", lambda: torch.ops.aten.nll_loss_forward(
                x.to(DEV), t.to(DEV), None if wt is None else wt.to(DEV), red, -100))
            close(on, o)
            close(twn, tw)
            go = torch.rand(o.shape, dtype=torch.float64)
            gi = torch.ops.aten.nll_loss_backward(go, x, t, wt, red, -100, tw)
            gin = native("aten::nll_loss_backward.grad_input", lambda: torch.ops.aten.nll_loss_backward(
                go.to(DEV), x.to(DEV), t.to(DEV), None if wt is None else wt.to(DEV), red, -100, twn))
            close(gin, gi)
    # All targets ignored: mean is 0/0 = nan, as on CPU.
    tt = torch.full((6,), -100)
    close(F.nll_loss(x.to(DEV), tt.to(DEV)), F.nll_loss(x, tt))
    with pytest.raises(IndexError, match="Target 7 is out of bounds"):
        F.nll_loss(x.to(DEV), torch.tensor([0, 7, 0, 0, 0, 0], device=DEV))
    with pytest.raises(IndexError, match="Target -3 is out of bounds"):
        F.nll_loss(x.to(DEV), torch.tensor([0, -3, 0, 0, 0, 0], device=DEV))
    with pytest.raises(Exception):
        F.nll_loss(x.to(DEV), t[:4].to(DEV))


def grads_match(fn, inputs, dtype, op_fwd=None, op_bwd=None, **tolkw):
    """fn(*inputs) on CPU and neuron: outputs and gradients of every input that requires grad."""
    cin = [t.detach().clone().requires_grad_(t.requires_grad) if t is not None else None for t in inputs]
    nin = [t.detach().to(DEV).requires_grad_(t.requires_grad) if t is not None else None for t in inputs]
    yc = fn(*cin)
    torch_neuronx.reset_op_counts()
    yn = fn(*nin)
    if op_fwd:
        c = torch_neuronx.op_counts()
        assert c.get(op_fwd, {}).get("native", 0) >= 1 and c[op_fwd]["fallback"] == 0, c
    close(yn, yc.detach(), dtype, **tolkw)
    g = make(yc.shape, yc.dtype, seed=7)
    yc.backward(g)
    torch_neuronx.reset_op_counts()
    yn.backward(g.to(DEV))
    if op_bwd:
        c = torch_neuronx.op_counts()
        assert c.get(op_bwd, {}).get("native", 0) >= 1 and c[op_bwd]["fallback"] == 0, c
    for a, b in zip(nin, cin):
        if b is not None and b.requires_grad:
            close(a.grad, b.grad, dtype, **tolkw)


@pytest.mark.parametrize("dtype", HALF_FLOATS)
def test_layer_norm(dtype):
    for shape, ns in [((3, 5, 7), (7,)), ((3, 5, 7), (5, 7)), ((4, 1500), (1500,)), ((6,), (6,))]:
        x = make(shape, dtype) * 2 + 1
        w = make(ns, dtype, seed=1).requires_grad_()
        b = make(ns, dtype, seed=2).requires_grad_()
        x.requires_grad_()
        grads_match(lambda x, w, b: F.layer_norm(x, ns, w, b), [x, w, b], dtype,
                    "aten::native_layer_norm", "aten::native_layer_norm_backward")
        grads_match(lambda x: F.layer_norm(x, ns), [x], dtype, "aten::native_layer_norm")
        grads_match(lambda x, w: F.layer_norm(x, ns, w, None), [x, w], dtype)
        if dtype != torch.float32:  # mixed: float parameters for a half input
            grads_match(lambda x, w, b: F.layer_norm(x, ns, w, b),
                        [x, w.detach().float().requires_grad_(), b.detach().float().requires_grad_()], dtype,
                        "aten::native_layer_norm", "aten::native_layer_norm_backward")
    # mean/rstd outputs: shapes and dtypes like CPU.
    x = make((3, 5, 7), dtype)
    w = make((7,), dtype)
    rc = torch.native_layer_norm(x, (7,), w, w, 1e-5)
    rn = torch.native_layer_norm(x.to(DEV), (7,), w.to(DEV), w.to(DEV), 1e-5)
    for a, b in zip(rn, rc):
        close(a, b, dtype)
    # Non-contiguous input.
    x = make((7, 5, 3), dtype).transpose(0, 2)
    close(F.layer_norm(x.to(DEV).transpose(0, 2).contiguous().transpose(0, 2), (7,)), F.layer_norm(x, (7,)))
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(x.to(DEV), (4,))


def test_layer_norm_float64_fallback():
    x = make((3, 5), torch.float64).requires_grad_()
    grads_match(lambda x: F.layer_norm(x, (5,)), [x], torch.float64)


@pytest.mark.parametrize("dtype", HALF_FLOATS)
def test_rms_norm(dtype):
    for shape, ns in [((3, 5, 7), (7,)), ((3, 5, 7), (5, 7)), ((2, 3000), (3000,)), ((6,), (6,))]:
        x = (make(shape, dtype) * 2).requires_grad_()
        w = make(ns, dtype, seed=1).requires_grad_()
        grads_match(lambda x, w: F.rms_norm(x, ns, w), [x, w], dtype,
                    "aten::_fused_rms_norm", "aten::_fused_rms_norm_backward")
        grads_match(lambda x: F.rms_norm(x, ns, eps=1e-3), [x], dtype, "aten::_fused_rms_norm")
    x = make((3, 5, 7), dtype)
    w = make((7,), dtype)
    yc, rc = torch.ops.aten._fused_rms_norm(x, [7], w, 1e-6)
    yn, rn = torch.ops.aten._fused_rms_norm(x.to(DEV), [7], w.to(DEV), 1e-6)
    close(yn, yc)
    close(rn, rc)
    assert rn.stride() == rc.stride()


def test_rms_norm_float64():
    x = make((3, 5), torch.float64).requires_grad_()
    w = make((5,), torch.float64, seed=1).requires_grad_()
    grads_match(lambda x, w: F.rms_norm(x, (5,), w), [x, w], torch.float64)


def test_llama_rms_norm_module():
    # HF's LlamaRMSNorm: pow/mean/rsqrt in float32, then the weight in the model dtype.
    class LlamaRMSNorm(torch.nn.Module):
        def __init__(self, n, eps=1e-6):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(n))
            self.eps = eps

        def forward(self, h):
            dt = h.dtype
            h = h.to(torch.float32)
            var = h.pow(2).mean(-1, keepdim=True)
            h = h * torch.rsqrt(var + self.eps)
            return self.weight * h.to(dt)

    m = LlamaRMSNorm(768)
    x = make((4, 768), torch.float32)
    mn = LlamaRMSNorm(768).to(DEV)
    mn.load_state_dict(m.state_dict())
    torch_neuronx.reset_op_counts()
    y = mn(x.to(DEV))
    assert torch_neuronx.op_counts()["aten::mean.out"]["native"] == 1
    close(y.detach(), m(x).detach())


@pytest.mark.parametrize("dtype", HALF_FLOATS)
def test_group_norm(dtype):
    for shape, G in [((2, 6, 5), 3), ((3, 4, 3, 5), 2), ((2, 8), 4), ((1, 6, 1500), 6)]:
        x = (make(shape, dtype) * 2 + 1).requires_grad_()
        C = shape[1]
        w = make((C,), dtype, seed=1).requires_grad_()
        b = make((C,), dtype, seed=2).requires_grad_()
        grads_match(lambda x, w, b: F.group_norm(x, G, w, b), [x, w, b], dtype,
                    "aten::native_group_norm", "aten::native_group_norm_backward")
        grads_match(lambda x: F.group_norm(x, G), [x], dtype, "aten::native_group_norm",
                    "aten::native_group_norm_backward")
        if dtype != torch.float32:
            grads_match(lambda x, w, b: F.group_norm(x, G, w, b),
                        [x, w.detach().float().requires_grad_(), b.detach().float().requires_grad_()], dtype,
                        "aten::native_group_norm", "aten::native_group_norm_backward")
    x = make((2, 6, 5), dtype)
    rc = torch.native_group_norm(x, None, None, 2, 6, 5, 3, 1e-5)
    rn = torch.native_group_norm(x.to(DEV), None, None, 2, 6, 5, 3, 1e-5)
    for a, b in zip(rn, rc):
        close(a, b, dtype)
    with pytest.raises(RuntimeError):
        F.group_norm(x.to(DEV), 4)


@pytest.mark.parametrize("dtype", FLOATS)
def test_reduction_out_variants(dtype):
    for shape, dim in [((3, 5, 7), 1), ((3, 5, 7), (0, 2)), ((1000,), 0), ((4, 6), None)]:
        for keep in [False, True]:
            c, n = both(make(shape, dtype, True) * 3)
            for corr in [0, 1]:
                for name in ["var", "std"]:
                    oc = torch.empty(0, dtype=dtype)
                    on = torch.empty(0, dtype=dtype, device=DEV)
                    getattr(torch, name)(c, dim, correction=corr, keepdim=keep, out=oc)
                    native(f"aten::{name}.correction_out",
                           lambda: getattr(torch, name)(n, dim, correction=corr, keepdim=keep, out=on))
                    close(on, oc)
            if dim is not None:
                oc, on = torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype, device=DEV)
                torch.logsumexp(c, dim, keep, out=oc)
                native("aten::logsumexp.out", lambda: torch.logsumexp(n, dim, keep, out=on))
                close(on, oc)
    c, n = both(make((5, 9), dtype, True))
    for name in ["max", "min"]:
        oc, on = torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype, device=DEV)
        getattr(torch, name)(c, out=oc)
        native(f"aten::{name}.unary_out", lambda: getattr(torch, name)(n, out=on))
        close(on, oc)
    # Wrong out dtype and integer inputs run the CPU kernel: the same results and errors.
    with pytest.raises(RuntimeError) as e_cpu:
        torch.max(c, out=torch.empty(0, dtype=torch.int64))
    with pytest.raises(RuntimeError) as e_dev:
        torch.max(n, out=torch.empty(0, dtype=torch.int64, device=DEV))
    assert str(e_cpu.value) == str(e_dev.value)
    oc, on = torch.empty(0), torch.empty(0, device=DEV)
    torch.logsumexp(make((3, 4), torch.int64), 1, out=oc)
    torch.logsumexp(make((3, 4), torch.int64).to(DEV), 1, out=on)
    close(on, oc)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
def test_max_min_small_ints(dtype):
    for shape in [(3, 5, 7), (1000,), ()]:
        for noncontig in [False, True]:
            x = make(shape, dtype, noncontig)
            if dtype == torch.int32 and x.numel() > 2:
                x[(1,) * x.dim()] = 2**31 - 1
                x[(0,) * (x.dim() - 1) + (2,)] = -(2**31)
            c, n = both(x)
            close(native("aten::max", lambda: n.max()), c.max())
            close(native("aten::min", lambda: n.min()), c.min())
            if c.dim():
                close(native("aten::amax.out", lambda: n.amax(0)), c.amax(0))
                close(native("aten::amin.out", lambda: n.amin(-1, True)), c.amin(-1, True))
    raises = []
    for t in [make((0,), dtype), make((0,), dtype).to(DEV)]:
        with pytest.raises(RuntimeError) as e:
            t.max()
        raises.append(str(e.value))
    assert raises[0] == raises[1]


COLUMN_CASES = [((7, 5), 0), ((33, 3), 0), ((1000, 37), 0), ((5, 17, 33), 0), ((5, 17, 33), 1), ((3, 300, 70), (0, 1)),
                ((65536, 8), 0), ((64, 2100), 0), ((17, 16), 0), ((17, 15), 0), ((300, 1), 0), ((2, 3, 4), 0)]


@pytest.mark.parametrize("shape,dim", COLUMN_CASES)
@pytest.mark.parametrize("dtype", HALF_FLOATS)
def test_sum_columns_exact(shape, dim, dtype):
    # A sum over an outer dim into contiguous columns (a bias gradient) runs as column sums in the
    # order PyTorch's CPU uses for them (a cascade for whole groups of 32 columns, 4 interleaved row
    # streams for the rest): the same bits, also for the mean, the float32-output sum and a slice.
    g = torch.Generator().manual_seed(len(shape) * 1000 + shape[-1])
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    n = x.to("neuron")
    for op, f in (("sum.IntList_out", lambda t: t.sum(dim)), ("mean.out", lambda t: t.mean(dim)),
                  ("sum.IntList_out", lambda t: t.sum(dim, dtype=torch.float32)),
                  ("sum.IntList_out", lambda t: t[..., : max(1, t.shape[-1] - 3)].sum(dim))):
        want, got = f(x), native("aten::" + op, lambda: f(n)).cpu()
        assert torch.equal(got, want), (shape, dim, dtype, op, (got.float() - want.float()).abs().max())


@pytest.mark.parametrize("n", [1, 7, 8, 31, 33, 257, 4095, 4096, 4097, 10_000, 100_003])
def test_sum_bf16_rows_exact(n):
    # Contiguous bfloat16 rows are summed while widened (no float chunk buffer), in the same cascade
    # order as PyTorch: the same bits for every row length around the vector, group and chunk sizes.
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(3, n, generator=g) * 3).to(torch.bfloat16)
    x[1, :: max(1, n // 5)] = float("inf") if n > 1 else 1.0
    got = x.to("neuron").sum(-1).cpu()
    assert torch.equal(got.view(torch.int16), x.sum(-1).view(torch.int16))
    close(x.to("neuron").mean(-1), x.mean(-1))
    close(x.to("neuron").sum(-1, dtype=torch.float32), x.sum(-1, dtype=torch.float32))
    close(x.to("neuron")[:, ::2].sum(-1), x[:, ::2].sum(-1))
    y = x.to("neuron")
    y[2, 0] = float("nan")
    assert torch.isnan(y.sum(-1)[2].cpu())


@pytest.mark.parametrize("dtype", HALF_FLOATS)
def test_sum_short_rows_exact(dtype):
    # Rows shorter than a vector are PyTorch's row_sum: 4 interleaved partial sums, the elements past the
    # first 4 added to the first. For 5-7 elements that is not the sequential order (a gradient of a
    # 0-dim tensor broadcast over 5 elements cancels down to exactly that last bit).
    g = torch.Generator().manual_seed(5)
    for n in range(1, 10):
        for x in [torch.randn(30, n, generator=g), torch.randn(30, 2 * n, generator=g)[:, ::2],
                  torch.randn(n, generator=g), torch.randn(3 * n, generator=g)[1::3]]:
            x = (x * 100).to(dtype)
            d = torch.empty_strided(x.shape, x.stride(), dtype=dtype, device="neuron").copy_(x)
            for op, f in (("sum.IntList_out", lambda t: t.sum(-1)), ("mean.out", lambda t: t.mean(-1)),
                          ("sum.IntList_out", lambda t: t.sum(-1, dtype=torch.float32)),
                          ("mean.out", lambda t: t.float().pow(2).mean(-1))):
                want, got = f(x), native("aten::" + op, lambda: f(d)).cpu()
                assert torch.equal(got, want), (n, x.stride(), dtype, (got.double() - want.double()).abs().max())


@pytest.mark.parametrize("dtype", HALF_FLOATS)
def test_softmax_exp_range(dtype):
    # The vector exp: masked (-inf) entries give exactly 0, spreads past 87 give PyTorch's subnormals
    # (not 0), inf/NaN rows give NaN; small batches of lines run on several threads.
    n = 515
    x = torch.randn(12, n) * 4
    x[0, ::3] = -float("inf")
    x[1, ::2] = -95.0
    x[1, 1::4] = -150.0
    x[2, 5] = float("inf")
    x[3, 7] = float("nan")
    x[4] = -float("inf")
    x[4, 0] = 0.0
    x = x.to(dtype)
    for log in (False, True):
        fn = torch.log_softmax if log else torch.softmax
        want = fn(x, -1)
        got = fn(x.to(DEV), -1)
        close(got, want)
        if not log:
            assert torch.equal(got.cpu()[0, ::3], torch.zeros_like(want[0, ::3]))
            assert torch.equal(got.cpu()[4, 1:], torch.zeros_like(want[4, 1:]))
    close(torch.softmax(x.to(DEV).view(1, 12, 1, n), -1), torch.softmax(x.view(1, 12, 1, n), -1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_log_softmax_last_dim_rounds_like_cpu(dtype):
    # PyTorch's CPU keeps the row's exp-sum and its log in bf16/fp16 over the last dim: the same bits here
    # (an fp32 log-sum differs from it by an ulp or two in most rows).
    g = torch.Generator().manual_seed(0)
    for shape in [(64, 7), (16, 33), (8, 100), (3, 5000), (4, 6, 40)]:
        for noncontig in [False, True]:
            x = (torch.randn(shape, generator=g) * 4).to(dtype)
            if noncontig:
                x = x.transpose(0, -1).contiguous().transpose(0, -1)
            c, n = both(x)
            r = native("aten::_log_softmax.out", lambda: F.log_softmax(n, -1))
            assert torch.equal(r.cpu(), F.log_softmax(c, -1)), (shape, noncontig)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_logsumexp_rounds_like_cpu(dtype):
    # PyTorch's CPU logsumexp rounds bf16/fp16 after each of its steps: the same bits here.
    g = torch.Generator().manual_seed(1)
    for shape, dim in [((64, 7), 1), ((16, 33), 0), ((4, 6, 40), (0, 2))]:
        c, n = both((torch.randn(shape, generator=g) * 4).to(dtype))
        assert torch.equal(n.logsumexp(dim).cpu(), c.logsumexp(dim)), (shape, dim)
