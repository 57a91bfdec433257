"""Native matrix products (mm, addmm, bmm, baddbmm, addmv, mv, dot and what linear/matmul become) equal
PyTorch CPU: odd shapes, transposed and strided operands, broadcasting, 0-size, out=, in-place, every
dtype, errors, autograd, a tiny Llama."""
import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from conftest import native_small_products

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
# Relative to sum_k |a_ik b_kj| (+ |beta self|): covers the output rounding of both sides and fp32
# summation order.
TOL = {torch.float32: 2e-6, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10, torch.float64: 1e-13}


@pytest.fixture(autouse=True)
def native_kernel():
    """Every test here holds the kernel itself to CPU, small products included (test_small_products_carry_cpu_bits
    checks the default rule)."""
    with native_small_products():
        yield


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return torch.randn(shape, generator=g).to(dtype)


def n(t):
    return t.to("neuron")


def check(got, want, mag, dtype):
    """|got - want| <= TOL * mag elementwise (mag: the magnitude of the terms summed, in fp64)."""
    assert got.device.type == "neuron"
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    err = (got.cpu().double() - want.double()).abs()
    bound = TOL[dtype] * mag.double() + 1e-30
    bad = err > bound
    assert not bad.any(), f"{int(bad.sum())} of {err.numel()} elements off; worst {float((err - bound).max())}"


def mag_mm(a, b):
    return a.double().abs() @ b.double().abs()


def layout(t, kind):
    """The same values as t in another memory layout: 'c' contiguous, 't' transposed storage,
    's' a strided slice of a larger tensor."""
    if kind == "t":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if kind == "s":
        big = torch.zeros(t.shape[:-1] + (2 * t.shape[-1] + 1,), dtype=t.dtype)
        big[..., 1::2] = t
        return big[..., 1::2]
    return t


def on_neuron(t, kind):
    """layout() on the device (the strides survive the transfer)."""
    if kind == "t":
        return n(t.transpose(-1, -2).contiguous()).transpose(-1, -2)
    if kind == "s":
        big = torch.zeros(t.shape[:-1] + (2 * t.shape[-1] + 1,), dtype=t.dtype, device="neuron")
        big[..., 1::2] = n(t)
        return big[..., 1::2]
    return n(t)


SHAPES = [(1, 1, 1), (1, 17, 63), (3, 129, 17), (16, 40, 33), (17, 63, 129), (63, 1, 33), (130, 70, 300)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mnk", SHAPES, ids=str)
@pytest.mark.parametrize("la,lb", [("c", "c"), ("c", "t"), ("t", "c"), ("s", "t"), ("t", "s")])
def test_mm(dtype, mnk, la, lb):
    m, nn, k = mnk
    a, b = rand(m, k, dtype=dtype), rand(k, nn, dtype=dtype, seed=1)
    na, nb = on_neuron(a, la), on_neuron(b, lb)
    if la != "c" and m > 1 and k > 1:
        assert not na.is_contiguous()
    torch_neuronx.reset_op_counts()
    got = torch.mm(na, nb)
    assert torch_neuronx.op_counts()["aten::mm"]["native"] == 1
    check(got, torch.mm(a, b), mag_mm(a, b), dtype)
    assert got.is_contiguous()


# bf16 around the blocking of the pair-packed (vdpbf16ps) kernels: 12-row tiles and their 8/4-row tails,
# 32-column panels, 512-deep and 144-row blocks, odd k, skinny rows 9..16 (both B layouts).
@pytest.mark.parametrize("mnk", [(150, 70, 513), (145, 33, 31), (14, 300, 1025), (9, 64, 65), (40, 290, 3),
                                 (128, 96, 768)], ids=str)
@pytest.mark.parametrize("la,lb", [("c", "t"), ("c", "c"), ("t", "s")])
def test_mm_bf16_block_edges(mnk, la, lb):
    m, nn, k = mnk
    a, b = rand(m, k, dtype=torch.bfloat16), rand(k, nn, dtype=torch.bfloat16, seed=1)
    check(torch.mm(on_neuron(a, la), on_neuron(b, lb)), torch.mm(a, b), mag_mm(a, b), torch.bfloat16)
    bias = rand(nn, dtype=torch.bfloat16, seed=2)
    mag = mag_mm(a, b) + bias.double().abs()
    check(torch.addmm(n(bias), on_neuron(a, la), on_neuron(b, lb)), torch.addmm(bias, a, b), mag, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias_shape", ["n", "1n", "m1", "mn", "scalar"])
@pytest.mark.parametrize("alpha,beta", [(1, 1), (0.5, 2), (-1.5, 0)])
def test_addmm(dtype, bias_shape, alpha, beta):
    m, nn, k = 19, 37, 45
    a, b = rand(m, k, dtype=dtype), rand(nn, k, dtype=dtype, seed=1).t()
    shape = {"n": (nn,), "1n": (1, nn), "m1": (m, 1), "mn": (m, nn), "scalar": ()}[bias_shape]
    bias = rand(*shape, dtype=dtype, seed=2) if shape else torch.tensor(0.75, dtype=dtype)
    if beta == 0:
        bias = torch.full_like(bias, float("nan"))  # beta = 0 must ignore it
    want = torch.addmm(bias, a, b, beta=beta, alpha=alpha)
    mag = abs(alpha) * mag_mm(a, b) + (abs(beta) * bias.double().abs() if beta else 0)
    got = torch.addmm(n(bias), n(a), n(b), beta=beta, alpha=alpha)
    check(got, want, mag, dtype)
    out = torch.empty(0, dtype=dtype, device="neuron")
    torch.addmm(n(bias), n(a), n(b), beta=beta, alpha=alpha, out=out)
    check(out, want, mag, dtype)
    if bias_shape == "mn":
        c = n(bias)
        r = c.addmm_(n(a), n(b), beta=beta, alpha=alpha)
        assert r is c
        check(c, want, mag, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bmnk", [(1, 1, 1, 1), (3, 1, 40, 33), (4, 17, 9, 30), (2, 40, 70, 130)], ids=str)
@pytest.mark.parametrize("lb", ["c", "t", "bcast"])
def test_bmm_baddbmm(dtype, bmnk, lb):
    bs, m, nn, k = bmnk
    a = rand(bs, m, k, dtype=dtype)
    if lb == "bcast":  # one matrix for every batch entry: batch stride 0
        b1 = rand(k, nn, dtype=dtype, seed=1)
        b, nb = b1.expand(bs, k, nn), n(b1).expand(bs, k, nn)
    else:
        b = rand(bs, k, nn, dtype=dtype, seed=1)
        nb = on_neuron(b, lb)
    na = on_neuron(a, "t")
    check(torch.bmm(na, nb), torch.bmm(a, b), mag_mm(a, b), dtype)
    out = torch.empty(0, dtype=dtype, device="neuron")
    torch.bmm(na, nb, out=out)
    check(out, torch.bmm(a, b), mag_mm(a, b), dtype)
    self_ = rand(bs, 1, nn, dtype=dtype, seed=3)
    want = torch.baddbmm(self_, a, b, beta=0.5, alpha=2)
    mag = 2 * mag_mm(a, b) + 0.5 * self_.double().abs()
    check(torch.baddbmm(n(self_), na, nb, beta=0.5, alpha=2), want, mag, dtype)
    full = self_.expand(bs, m, nn).contiguous()
    c = n(full)
    c.baddbmm_(na, nb, beta=0.5, alpha=2)
    check(c, want, mag, dtype)
    out = torch.empty(bs, m, nn, dtype=dtype, device="neuron")
    torch.baddbmm(n(self_), na, nb, beta=0.5, alpha=2, out=out)
    check(out, want, mag, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mk", [(1, 1), (5, 70), (300, 17), (33, 600)], ids=str)
@pytest.mark.parametrize("lm", ["c", "t"])
def test_mv_addmv(dtype, mk, lm):
    m, k = mk
    mat, vec = rand(m, k, dtype=dtype), rand(2 * k, dtype=dtype, seed=1)[::2]
    nmat, nvec = on_neuron(mat, lm), n(rand(2 * k, dtype=dtype, seed=1))[::2]
    mag = mag_mm(mat, vec[:, None])[:, 0]
    check(torch.mv(nmat, nvec), torch.mv(mat, vec), mag, dtype)
    check(nmat @ nvec, mat @ vec, mag, dtype)
    bias = torch.full((m,), float("nan"), dtype=dtype)
    check(torch.addmv(n(bias), nmat, nvec, beta=0), torch.addmv(bias, mat, vec, beta=0), mag, dtype)
    bias = rand(m, dtype=dtype, seed=2)
    want = torch.addmv(bias, mat, vec, beta=-1, alpha=3)
    mag3 = 3 * mag + bias.double().abs()
    check(torch.addmv(n(bias), nmat, nvec, beta=-1, alpha=3), want, mag3, dtype)
    out = torch.empty(0, dtype=dtype, device="neuron")
    torch.addmv(n(bias), nmat, nvec, beta=-1, alpha=3, out=out)
    check(out, want, mag3, dtype)
    c = n(bias)
    c.addmv_(nmat, nvec, beta=-1, alpha=3)
    check(c, want, mag3, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", [1, 16, 1000])
def test_dot(dtype, k):
    a, b = rand(k, dtype=dtype), rand(3 * k, dtype=dtype, seed=1)[::3]
    na, nb = n(a), n(rand(3 * k, dtype=dtype, seed=1))[::3]
    mag = (a.double().abs() * b.double().abs()).sum()
    check(torch.dot(na, nb), torch.dot(a, b), mag, dtype)
    check(na @ nb, a @ b, mag, dtype)


@pytest.mark.parametrize("sa,sb", [((2, 3, 4, 5), (5, 6)), ((5,), (2, 5, 6)), ((3, 1, 4, 5), (2, 5, 6)),
                                   ((2, 3, 4, 5), (5,)), ((7, 5), (3, 5, 2)), ((1, 4, 5), (3, 5, 2))], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matmul_broadcasting(sa, sb, dtype):
    a, b = rand(*sa, dtype=dtype), rand(*sb, dtype=dtype, seed=1)
    want = torch.matmul(a, b)
    mag = torch.matmul(a.double().abs(), b.double().abs())
    check(torch.matmul(n(a), n(b)), want, mag, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 3, 8, 12, 40])
def test_linear_matches_cpu(dtype, m):
    x, w, b = rand(2, m, 96, dtype=dtype), rand(80, 96, dtype=dtype, seed=1), rand(80, dtype=dtype, seed=2)
    mag = mag_mm(x, w.t()) + b.double().abs()
    torch_neuronx.reset_op_counts()
    check(F.linear(n(x), n(w), n(b)), F.linear(x, w, b), mag, dtype)
    check(F.linear(n(x), n(w)), F.linear(x, w), mag_mm(x, w.t()), dtype)
    counts = torch_neuronx.op_counts()
    for op in ("aten::mm", "aten::mm.out", "aten::addmm", "aten::addmm.out"):
        assert counts.get(op, {"fallback": 0})["fallback"] == 0, op


@pytest.mark.parametrize("self_form", ["bias", "column", "strided"])
def test_non_dense_operands_take_the_native_kernel(self_form):
    # An expanded bias (a linear layer's), a broadcast column or a strided view is not dense; PyTorch's overlap
    # check calls such tensors TooHard, which once sent every biased addmm to the CPU kernel. The native
    # kernel's bits are those of the same product with the operand made dense (K = 1536 sums differ from the
    # CPU kernel's in the last bits).
    x, w = rand(70, 1536), rand(96, 1536, seed=1)
    base = rand(70, 192, seed=2)
    s = {"bias": rand(96, seed=3), "column": rand(70, 1, seed=3), "strided": base[:, ::2]}[self_form]
    got = torch.addmm(n(s), n(x), n(w).t())
    dense = torch.addmm(n(s).expand(70, 96).contiguous(), n(x), n(w).t())
    assert torch.equal(got.cpu(), dense.cpu())
    torch.testing.assert_close(got.cpu(), torch.addmm(s, x, w.t()), rtol=1e-5, atol=1e-4)
    # a strided A and B as well
    xs, ws = rand(70, 3072)[:, ::2], rand(3072, 96, seed=1)[::2]
    torch.testing.assert_close(torch.mm(n(xs), n(ws)).cpu(), torch.mm(n(xs.contiguous()), n(ws.contiguous())).cpu(),
                               rtol=0, atol=0)


def test_zero_sizes():
    for sa, sb in [((0, 5), (5, 3)), ((4, 0), (0, 3)), ((4, 5), (5, 0)), ((0, 3, 4), (0, 4, 2)), ((2, 3, 0), (2, 0, 4))]:
        a, b = rand(*sa), rand(*sb, seed=1)
        got = torch.matmul(n(a), n(b))
        assert got.shape == torch.matmul(a, b).shape
        torch.testing.assert_close(got.cpu(), torch.matmul(a, b))
    # K = 0: beta * self (and zeros for beta = 0, even over NaN).
    self_ = rand(4, 3)
    a, b = rand(4, 0), rand(0, 3)
    torch.testing.assert_close(torch.addmm(n(self_), n(a), n(b), beta=0.5).cpu(), torch.addmm(self_, a, b, beta=0.5))
    nan = torch.full((4, 3), float("nan"))
    torch.testing.assert_close(torch.addmm(n(nan), n(a), n(b), beta=0).cpu(), torch.zeros(4, 3))
    torch.testing.assert_close(torch.dot(n(rand(0)), n(rand(0))).cpu(), torch.tensor(0.0))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.complex64], ids=str)
def test_other_dtypes_equal_cpu(dtype):
    if dtype.is_complex:
        a, b = torch.randn(5, 7, dtype=dtype), torch.randn(7, 3, dtype=dtype)
    else:
        a, b = torch.randint(-9, 9, (5, 7)).to(dtype), torch.randint(-9, 9, (7, 3)).to(dtype)
    torch.testing.assert_close(torch.mm(n(a), n(b)).cpu(), torch.mm(a, b))
    torch.testing.assert_close(torch.bmm(n(a)[None], n(b)[None]).cpu(), torch.bmm(a[None], b[None]))
    torch.testing.assert_close(torch.mv(n(a), n(b)[:, 0]).cpu(), torch.mv(a, b[:, 0]))
    if dtype.is_complex:  # conjugated views are resolved by the CPU kernel
        torch.testing.assert_close(torch.mm(n(a), n(b).conj()).cpu(), torch.mm(a, b.conj()))


def raises_like_cpu(fn, *args, **kwargs):
    with pytest.raises(Exception) as cpu_err:
        fn(*args, **kwargs)
    nargs = [n(x) if isinstance(x, torch.Tensor) else x for x in args]
    nkw = {k: n(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with pytest.raises(type(cpu_err.value)) as err:
        fn(*nargs, **nkw)
    assert str(err.value).split("\n")[0] == str(cpu_err.value).split("\n")[0]


def test_errors_match_cpu():
    raises_like_cpu(torch.mm, rand(2, 3), rand(4, 5))
    raises_like_cpu(torch.mm, rand(2, 3), rand(3))
    raises_like_cpu(torch.mm, rand(2, 3), rand(3, 4).double())
    raises_like_cpu(torch.addmm, rand(3), rand(2, 3), rand(3, 4))
    raises_like_cpu(torch.bmm, rand(2, 2, 3), rand(3, 3, 4))
    raises_like_cpu(torch.bmm, rand(2, 2, 3), rand(2, 4, 4))
    raises_like_cpu(torch.baddbmm, rand(2, 5, 4), rand(2, 2, 3), rand(2, 3, 4))
    raises_like_cpu(torch.mv, rand(2, 3), rand(4))
    raises_like_cpu(torch.addmv, rand(3), rand(2, 3), rand(3))
    raises_like_cpu(torch.dot, rand(3), rand(4))
    raises_like_cpu(torch.dot, rand(3), rand(3).double())
    raises_like_cpu(torch.matmul, rand(2, 3), rand(4, 5))
    raises_like_cpu(torch.mm, rand(2, 3), rand(3, 4), out=torch.empty(2, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(n(rand(2, 3)), rand(3, 4))


def test_out_resize_and_noncontiguous_out():
    a, b = rand(5, 7), rand(7, 9, seed=1)
    out = torch.empty(9, 5, device="neuron").t()  # a transposed output view
    torch.mm(n(a), n(b), out=out)
    assert out.stride() == (1, 5)
    torch.testing.assert_close(out.cpu(), a @ b)
    out = torch.empty(0, device="neuron")
    torch.mm(n(a), n(b), out=out)
    assert out.shape == (5, 9)
    torch.testing.assert_close(out.cpu(), a @ b)
    # an output that overlaps an input goes through the CPU kernel, like CPU
    x = rand(6, 6)
    want = x.clone()
    torch.mm(want, rand(6, 6, seed=2), out=want[:, :])
    nx = n(x)
    torch.mm(nx, n(rand(6, 6, seed=2)), out=nx[:, :])
    torch.testing.assert_close(nx.cpu(), want)


# A linear layer's backward products past the blocking (144 rows, 512 columns, 256 deep, with edges): dX = dY @ W
# reads W n-contiguous, dW = dY^T @ X reads dY^T i-contiguous and X n-contiguous, both packed a block at a time.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_linear_backward_products_past_the_blocking(dtype):
    x, w, dy = rand(157, 270, dtype=dtype), rand(531, 270, dtype=dtype, seed=1), rand(157, 531, dtype=dtype, seed=2)
    xn, wn, dyn = n(x), n(w), n(dy)
    check(dyn @ wn, dy @ w, mag_mm(dy, w), dtype)
    check(dyn.t() @ xn, dy.t() @ x, mag_mm(dy.t(), x), dtype)
    # the same through autograd
    xs = xn.clone().requires_grad_()
    ws = wn.clone().requires_grad_()
    F.linear(xs, ws).backward(dyn)
    check(xs.grad, dy @ w, mag_mm(dy, w), dtype)
    check(ws.grad, dy.t() @ x, mag_mm(dy.t(), x), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_autograd_linear_matmul(dtype):
    x, w, b = rand(3, 5, 24, dtype=dtype), rand(16, 24, dtype=dtype, seed=1), rand(16, dtype=dtype, seed=2)
    m2 = rand(3, 16, 7, dtype=dtype, seed=3)
    grads = {}
    for dev in ("cpu", "neuron"):
        xs, ws, bs, ms = (t.detach().clone().to(dev).requires_grad_() for t in (x, w, b, m2))
        y = torch.matmul(F.linear(xs, ws, bs), ms)
        (y * y).sum().backward()
        grads[dev] = [t.grad.cpu() for t in (xs, ws, bs, ms)] + [y.detach().cpu()]
    for g_n, g_c in zip(grads["neuron"], grads["cpu"]):
        torch.testing.assert_close(g_n, g_c, rtol=1e-4, atol=1e-4)


def test_tiny_llama_forward_equals_cpu():
    from torch_neuronx.testing.tiny_models import make_tiny_llama

    model, tok = make_tiny_llama()
    ids = torch.randint(5, len(tok), (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        torch_neuronx.reset_op_counts()
        got = model.to("neuron")(input_ids=ids.to("neuron")).logits.cpu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    counts = torch_neuronx.op_counts()
    native = sum(counts.get(op, {"native": 0})["native"] for op in ("aten::mm", "aten::addmm", "aten::bmm"))
    assert native > 0
    for op in ("aten::mm.out", "aten::addmm.out", "aten::bmm.out"):
        assert counts.get(op, {"fallback": 0})["fallback"] == 0, op


def test_fma_probe_and_isa():
    assert torch_neuronx._C._gemm_isa() in ("avx512", "avx2", "generic")
    peak = torch_neuronx._C._fma_peak_gflops()
    assert peak >= 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_addmm_tall_output_through_a_buffer(dtype):
    """beta != 0 (or a bf16 output) accumulates in a per-thread buffer; a tall output (here 2 x 2500 rows of
    600 columns) runs in row chunks that keep it within 1M floats. Each chunk's rows must land in place."""
    torch.manual_seed(0)
    c, a, b = torch.randn(5000, 600).to(dtype), torch.randn(70, 5000).to(dtype).t(), torch.randn(70, 600).to(dtype)
    want = torch.addmm(c, a, b, beta=0.5, alpha=2)
    got = torch.addmm(c.to("neuron"), a.to("neuron"), b.to("neuron"), beta=0.5, alpha=2).cpu()
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-1)
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_small_products_carry_cpu_bits(dtype):
    """Products of at most 64^3 multiply-adds run CPU's own GEMM on the device memory, so they equal CPU
    bit for bit on any CPU (AMD's small products round each term, a Xeon's fuse them)."""
    torch_neuronx._C._cpu_bits_macs(262144)  # the default rule, within this test
    for mnk, la, lb in [((5, 5, 5), "c", "c"), ((5, 5, 5), "t", "s"), ((16, 16, 16), "c", "t"), ((3, 7, 11), "s", "c"),
                        ((50, 50, 50), "t", "c"), ((64, 64, 64), "c", "s")]:
        m, k, nn = mnk
        a, b = rand(m, k, dtype=dtype, seed=m), rand(k, nn, dtype=dtype, seed=nn + 1)
        assert torch.equal(torch.mm(on_neuron(a, la), on_neuron(b, lb)).cpu(), torch.mm(layout(a, la), layout(b, lb)))
        s = rand(m, nn, dtype=dtype, seed=3)
        assert torch.equal(torch.addmm(n(s), n(a), n(b), beta=0.5, alpha=2).cpu(), torch.addmm(s, a, b, beta=0.5, alpha=2))
    a, b = rand(4, 5, 6, dtype=dtype), rand(4, 6, 5, dtype=dtype, seed=2)
    assert torch.equal(torch.bmm(n(a), n(b)).cpu(), torch.bmm(a, b))
    v = rand(6, dtype=dtype, seed=4)
    assert torch.equal(torch.mv(n(a[0]), n(v)).cpu(), torch.mv(a[0], v))
    assert torch.equal(torch.dot(n(v), n(v)).cpu(), torch.dot(v, v))



@pytest.mark.parametrize("dot", ["0", "1"])
def test_bf16_packed_path_choice(dot):
    # Packed bf16 products run on vdpbf16ps where it outruns the FMAs (measured at the first product), else
    # through the fp32 micro-kernels; TORCH_NEURONX_BF16_DOT pins the choice. Both must equal CPU, which a
    # fresh process shows (the choice is made once per process).
    import os
    import subprocess
    import sys
    code = (
        "import torch, torch_neuronx\n"
        "g = torch.Generator().manual_seed(0)\n"
        "for m, n, k in [(150, 70, 513), (145, 33, 31), (300, 600, 1100)]:\n"
        "    a = torch.randn(m, k, generator=g).bfloat16(); b = torch.randn(k, n, generator=g).bfloat16()\n"
        "    got = torch.mm(a.to('neuron'), b.to('neuron')).cpu().double()\n"
        "    mag = a.double().abs() @ b.double().abs()\n"
        "    err = (got - torch.mm(a, b).double()).abs()\n"
        "    assert (err <= 2 ** -7 * mag).all(), (m, n, k, (err / mag).max().item())\n"
        "print('ok')\n")
    env = dict(os.environ, TORCH_NEURONX_BF16_DOT=dot)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
