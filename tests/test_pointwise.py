"""Element-wise ops on neuron against PyTorch CPU: every registered overload, odd shapes, non-contiguous
inputs, broadcasting, 0-size, type promotion, scalars, in-place, out=, NaN/inf and autograd."""

import math

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx

N = "neuron"
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


def make(shape, dtype, lo=-4.0, hi=4.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    lo_i = 0 if dtype == torch.uint8 else int(lo * 10)
    return torch.randint(lo_i, int(hi * 10) + 1, shape, generator=g, dtype=dtype)


def layouts(shape, dtype, **kw):
    """A contiguous tensor, a transposed view and a strided slice with the same values' shape."""
    x = make(shape, dtype, **kw)
    yield x
    yield make(shape[::-1], dtype, **kw).t() if len(shape) == 2 else x
    big = make((shape[0], shape[1] * 2) if len(shape) == 2 else (shape[0] * 2,), dtype, **kw)
    yield big[:, ::2] if len(shape) == 2 else big[::2]


def check(fn, *cpu_args, atol=None, rtol=None, **kw):
    want = fn(*cpu_args, **kw)
    dev = [a.to(N) if isinstance(a, torch.Tensor) else a for a in cpu_args]
    dkw = {k: v.to(N) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    got = fn(*dev, **dkw)
    assert got.device.type == N
    assert got.dtype == want.dtype and got.shape == want.shape
    if atol is None:
        torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    else:
        torch.testing.assert_close(got.cpu(), want, equal_nan=True, atol=atol, rtol=rtol)


def assert_native(*ops):
    counts = torch_neuronx.op_counts()
    for op in ops:
        assert counts.get(op, {}).get("native", 0) > 0, (op, counts.get(op))
        assert counts.get(op, {}).get("fallback", 0) == 0, (op, counts.get(op))


UNARY = {
    "neg": (torch.neg, -4, 4),
    "abs": (torch.abs, -4, 4),
    "exp": (torch.exp, -20, 20),
    "log": (torch.log, 1e-3, 100),
    "sqrt": (torch.sqrt, 0, 100),
    "rsqrt": (torch.rsqrt, 1e-2, 100),
    "reciprocal": (torch.reciprocal, 0.1, 10),
    "sin": (torch.sin, -10, 10),
    "cos": (torch.cos, -10, 10),
    "tanh": (torch.tanh, -6, 6),
    "sigmoid": (torch.sigmoid, -20, 20),
    "silu": (F.silu, -20, 20),
    "gelu": (F.gelu, -6, 6),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), -6, 6),
    "relu": (torch.relu, -4, 4),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float(name, dtype):
    fn, lo, hi = UNARY[name]
    torch_neuronx.reset_op_counts()
    for x in layouts((37, 53), dtype, lo=lo, hi=hi):
        check(fn, x)
    check(fn, make((0, 5), dtype))
    check(fn, make((), dtype, lo=max(lo, 0.5), hi=hi))
    reg = {"relu": "aten::relu", "gelu_tanh": "aten::gelu.out"}.get(name, f"aten::{name}.out")
    assert_native(reg)


def test_unary_specials():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, 88.0, 89.0, -104.0, 1e5, -3e4])
    for name, (fn, _, _) in UNARY.items():
        # PyTorch's CPU gelu (oneDNN) returns NaN for +inf, where x * Phi(x) is +inf; ours gives inf.
        check(fn, x[x != float("inf")] if name == "gelu" else x)
    check(torch.exp, torch.linspace(-100, 100, 10001))
    check(torch.log, torch.logspace(-44, 38, 5001))
    check(torch.tanh, torch.linspace(-1, 1, 4001))
    check(torch.sin, torch.linspace(-20000, 20000, 7777))


@pytest.mark.parametrize("dtype", INTS)
def test_unary_int(dtype):
    torch_neuronx.reset_op_counts()
    x = make((31, 17), dtype)
    check(torch.neg, x) if dtype != torch.uint8 else None
    check(torch.abs, x)
    check(torch.relu, x)
    check(torch.bitwise_not, x)
    check(torch.logical_not, x)
    check(torch.exp, x)  # promoted to float
    check(torch.sqrt, x.abs())
    check(torch.clamp, x, -5, 7)
    check(torch.pow, x, 2)
    check(torch.pow, x, 3)
    assert_native("aten::abs.out", "aten::bitwise_not.out", "aten::logical_not.out", "aten::exp.out",
                  "aten::clamp.out", "aten::pow.Tensor_Scalar_out")


def test_bool_ops():
    a, b = make((9, 13), torch.bool, seed=1), make((9, 13), torch.bool, seed=2)
    for fn in (torch.logical_and, torch.logical_or, torch.logical_xor, torch.bitwise_and, torch.bitwise_or,
               torch.bitwise_xor, torch.add, torch.mul, torch.eq, torch.ne, torch.lt):
        check(fn, a, b)
    check(torch.bitwise_not, a)
    check(torch.logical_not, a)
    with pytest.raises(RuntimeError, match="Boolean inputs not supported for relu"):
        torch.relu(a.to(N))
    with pytest.raises(RuntimeError):
        torch.sub(a.to(N), b.to(N))


BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "maximum_clamp_min": lambda a, b: torch.clamp_min(a, b),
    "minimum_clamp_max": lambda a, b: torch.clamp_max(a, b),
    "pow": torch.pow,
}


@pytest.mark.parametrize("dtype", FLOATS + [torch.int32, torch.int64, torch.int8])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, dtype):
    fn = BINARY[name]
    if name.startswith("div_") and not dtype.is_floating_point:
        lo = 1  # no zero divisors for integers
    else:
        lo = -4
    if name == "pow":
        a_lo, b_lo, b_hi = (0.1, -2, 3) if dtype.is_floating_point else (-3, 0, 0.3)
    else:
        a_lo, b_lo, b_hi = -4, lo, 4
    for a in layouts((23, 41), dtype, lo=a_lo, hi=4):
        b = make((23, 41), dtype, lo=b_lo, hi=b_hi, seed=3)
        if name.startswith("div_") and not dtype.is_floating_point:
            b = torch.where(b == 0, torch.ones_like(b), b)
        check(fn, a, b)
        check(fn, a, b[0])  # broadcast a row
        check(fn, a[:, :1], b)  # broadcast a column
    check(fn, make((0, 3), dtype), make((0, 3), dtype))


def test_alpha_and_scalars():
    for dtype in FLOATS + [torch.int32, torch.int64]:
        a, b = make((17, 29), dtype), make((17, 29), dtype, seed=5)
        # Fused a + alpha * b like the CPU kernel; float16 may still differ by one rounding step.
        tol = dict(atol=1e-3, rtol=2e-3) if dtype == torch.float16 else {}
        check(torch.add, a, b, alpha=3, **tol)
        check(torch.sub, a, b, alpha=2, **tol)
        check(lambda x: x + 1, a)
        check(lambda x: 2 - x, a)
        check(lambda x: x * 0.5, a)
        check(lambda x: x / 3, a)
        check(lambda x: x < 1, a)
        check(lambda x: x == 1, a)
        check(lambda x: x ** 2, a)
        check(lambda x: 2 ** x, a.clamp(-3, 3))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a, b = make((17, 29), dtype), make((17, 29), dtype, seed=5)
        check(torch.add, a, b, alpha=0.37, **(dict(atol=1e-3, rtol=2e-3) if dtype == torch.float16 else {}))
        check(lambda x: x ** 0.5, a.abs())
        check(lambda x: x ** -0.5, a.abs() + 0.1)
        check(lambda x: x ** -1, a.abs() + 0.1)
        check(lambda x: x ** -2, a.abs() + 0.1)
        check(lambda x: x ** 1.7, a.abs())
        check(lambda x: x ** 0, a)
        check(lambda x: x ** 1, a)


def test_type_promotion():
    i = make((13, 7), torch.int32)
    f = make((13, 7), torch.float32)
    bf = make((13, 7), torch.bfloat16)
    h = make((7,), torch.float16)
    for fn in (torch.add, torch.mul, torch.div, torch.sub, torch.lt, torch.maximum if False else torch.clamp_min):
        check(fn, i, f)
        check(fn, bf, f)
        check(fn, bf, h)
        check(fn, i, bf)
    # CPU 0-dim tensors mixed with neuron tensors, as with CUDA.
    for s in (torch.tensor(2.5), torch.tensor(3), torch.tensor(0.1, dtype=torch.float64)):
        for x in (f, bf, i):
            want = x * s
            got = x.to(N) * s
            torch.testing.assert_close(got.cpu(), want)
            torch.testing.assert_close((x.to(N) + s).cpu(), x + s)
            torch.testing.assert_close((x.to(N) / s).cpu(), x / s)
    # Non-scalar CPU tensors are still rejected.
    with pytest.raises(RuntimeError):
        f.to(N) + f


def test_inplace_and_out():
    torch_neuronx.reset_op_counts()
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        a, b = make((19, 33), dtype), make((33,), dtype, seed=7)
        for op in ("add_", "sub_", "mul_", "clamp_min_"):
            x, y = a.clone(), a.to(N)
            getattr(x, op)(b)
            getattr(y, op)(b.to(N))
            torch.testing.assert_close(y.cpu(), x)
        # In place on a non-contiguous view.
        x, y = a.clone(), a.to(N)
        x.t()[::2].mul_(3)
        y.t()[::2].mul_(3)
        torch.testing.assert_close(y.cpu(), x)
    for fn in (torch.sigmoid_, torch.tanh_, torch.exp_, torch.relu_, torch.sqrt_, torch.rsqrt_, torch.neg_,
               torch.reciprocal_):
        x = make((11, 13), torch.float32, lo=0.1, hi=3)
        y = x.to(N)
        fn(x)
        fn(y)
        torch.testing.assert_close(y.cpu(), x)
    x = make((11, 13), torch.float32)
    y = x.to(N)
    F.silu(x, inplace=True)
    F.silu(y, inplace=True)
    torch.testing.assert_close(y.cpu(), x)
    # out= with resize, with a non-contiguous out, with a wider dtype, and a predicate into float.
    a, b = make((5, 6), torch.float32), make((5, 6), torch.float32, seed=2)
    out = torch.empty(0, device=N)
    torch.add(a.to(N), b.to(N), out=out)
    torch.testing.assert_close(out.cpu(), a + b)
    out = torch.empty(6, 5, device=N).t()
    torch.mul(a.to(N), b.to(N), out=out)
    torch.testing.assert_close(out.cpu(), a * b)
    out64 = torch.empty(5, 6, dtype=torch.float64, device=N)
    torch.add(a.to(N), b.to(N), out=out64)
    torch.testing.assert_close(out64.cpu(), torch.add(a, b, out=torch.empty(5, 6, dtype=torch.float64)))
    outf = torch.empty(5, 6, device=N)
    torch.lt(a.to(N), b.to(N), out=outf)
    torch.testing.assert_close(outf.cpu(), (a < b).float())
    with pytest.raises(RuntimeError):
        torch.add(a.to(N), b.to(N), out=torch.empty(5, 6, dtype=torch.int32, device=N))
    with pytest.raises(RuntimeError, match="size"):
        a.to(N) + make((4, 6), torch.float32).to(N)
    assert_native("aten::add.out", "aten::mul.out", "aten::sigmoid.out", "aten::lt.Tensor_out")


def test_int_division():
    a = torch.tensor([7, -7, 7, -7, 0, 5], dtype=torch.int32)
    b = torch.tensor([2, 2, -2, -2, 3, -1], dtype=torch.int32)
    for mode in ("trunc", "floor"):
        check(torch.div, a, b, rounding_mode=mode)
    check(torch.div, a, b)  # true division promotes to float
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.div(a.to(N), torch.zeros_like(b).to(N), rounding_mode="floor")
    f = torch.tensor([7.5, -7.5, 1.0, -1.0, 0.0, float("inf")])
    g = torch.tensor([2.0, 2.0, 0.0, 0.0, -3.0, 2.0])
    for mode in ("trunc", "floor", None):
        check(torch.div, f, g, rounding_mode=mode)


def test_nan_inf_propagation():
    x = torch.tensor([float("nan"), 1.0, float("inf"), -float("inf"), 0.0, -2.0])
    y = torch.tensor([0.0, float("nan"), float("inf"), 1.0, 0.0, float("nan")])
    for fn in (torch.add, torch.mul, torch.div, torch.maximum if False else torch.clamp_min, torch.clamp_max,
               torch.eq, torch.ne, torch.lt, torch.ge, torch.logical_and, torch.pow):
        check(fn, x, y)
    check(torch.clamp, x, -1.0, 1.0)
    check(torch.clamp, x, min=float("nan"))
    check(torch.clamp, x, y, x.abs())
    check(torch.where, x > 0, x, y)


def test_where_masked_fill_clamp():
    torch_neuronx.reset_op_counts()
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        c = make((21, 35), torch.bool, seed=4)
        a, b = make((21, 35), dtype, seed=5), make((35,), dtype, seed=6)
        check(torch.where, c, a, b)
        check(torch.where, c[:, :1], a.t().contiguous().t(), b)
        check(torch.where, c, a, 0 if dtype != torch.bool else True)
        x, y = a.clone(), a.to(N)
        val = 1 if dtype != torch.bool else True
        x.masked_fill_(c[0], val)
        y.masked_fill_(c[0].to(N), val)
        torch.testing.assert_close(y.cpu(), x)
        check(lambda t, m: t.masked_fill(m, torch.tensor(val)), a, c)
    a = make((21, 35), torch.float32)
    check(torch.where, a > 0, a, torch.tensor(2.0))  # CPU scalar operand
    check(torch.where, a > 0, a.double(), a)  # promotion
    check(torch.clamp, a, -1, 2)
    check(torch.clamp, a, min=-1)
    check(torch.clamp, a, max=0.5)
    check(torch.clamp, a, a[0] - 1, a[0] + 1)
    check(torch.clamp, a, min=a[0])
    check(torch.clamp, a, max=a[:, :1])
    check(torch.clamp_min, a, a[0])
    check(torch.clamp_max, a, a[:, :1])
    check(torch.clamp, a.bfloat16(), -1, 1)
    check(torch.clamp, a, 2, -1)  # min > max gives max
    with pytest.raises(RuntimeError, match="masked_fill_ only supports boolean masks"):
        a.to(N).masked_fill_(torch.ones(21, 35, dtype=torch.uint8, device=N), 1.0)
    with pytest.raises(RuntimeError, match="0-dimensional value tensor"):
        a.to(N).masked_fill_(a.to(N) > 0, torch.ones(2, device=N))
    with pytest.raises(RuntimeError, match="At least one of 'min' or 'max' must not be None"):
        torch.clamp(a.to(N))
    assert_native("aten::where.self", "aten::masked_fill_.Scalar", "aten::masked_fill_.Tensor",
                  "aten::clamp.out", "aten::clamp.Tensor_out", "aten::clamp_min.Tensor_out",
                  "aten::clamp_max.Tensor_out")


def test_large_parallel():
    # Several chunks of the thread pool, odd length.
    a = make((1_000_003,), torch.float32, seed=11)
    b = make((1_000_003,), torch.bfloat16, seed=12)
    check(torch.add, a, b)
    check(F.silu, b)
    check(torch.mul, a[:999919].view(1009, 991)[:, 1:], a[:999919].view(1009, 991)[:, :-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_backward_ops(dtype):
    torch_neuronx.reset_op_counts()
    x = make((29, 31), dtype, lo=-5, hi=5)
    g = make((29, 31), dtype, seed=9)
    y = torch.sigmoid(x)
    check(torch.ops.aten.silu_backward, g, x)
    check(torch.ops.aten.gelu_backward, g, x)
    check(lambda a, b: torch.ops.aten.gelu_backward(a, b, approximate="tanh"), g, x)
    check(torch.ops.aten.sigmoid_backward, g, y)
    check(torch.ops.aten.tanh_backward, g, torch.tanh(x))
    check(torch.ops.aten.threshold_backward, g, x, 0.5)
    assert_native("aten::silu_backward.grad_input", "aten::gelu_backward.grad_input",
                  "aten::sigmoid_backward.grad_input", "aten::tanh_backward.grad_input",
                  "aten::threshold_backward.grad_input")


@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_tanh", "sigmoid", "tanh", "relu"])
def test_autograd(name):
    fn = UNARY[name][0]
    x = make((17, 23), torch.float32, lo=-5, hi=5)
    g = make((17, 23), torch.float32, seed=3)
    xc = x.clone().requires_grad_()
    fn(xc).backward(g)
    xn = x.to(N).requires_grad_()
    fn(xn).backward(g.to(N))
    torch.testing.assert_close(xn.grad.cpu(), xc.grad)


def test_unsupported_dtype_falls_back():
    # complex and uint32 have no kernels: results still equal CPU.
    z = torch.randn(5, 7, dtype=torch.complex64)
    check(torch.add, z, z)
    check(torch.mul, z, z)
    check(torch.exp, z)
    u = torch.randint(0, 1000, (5, 7), dtype=torch.int64).to(torch.uint32)
    check(torch.eq, u, u)


def _special_f32(n, seed=0):
    """n float32 values with the cases a float -> 16-bit rounding gets wrong: NaNs (both signs, a
    payload), infinities, subnormals, signed zeros, overflow to inf, and exact bfloat16 ties with even
    and odd last kept bit, mixed with random values."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64)
    special = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0x7F800000, 0xFF800000, 0x00000001,
               0x80000001, 0x007FFFFF, 0x00400000, 0x0000FFFF, 0x00008000, 0x00018000, 0x80000000, 0,
               0x7F7FFFFF, 0xFF7FFFFF, 0x3F808000, 0x3F818000, 0xBF808000, 0x3F807FFF, 0x3F808001,
               0x477FF000, 0x33000000, 0x387FC000]
    if n >= 4:
        idx = torch.randint(0, n, (n // 4,), generator=g)
        bits[idx] = torch.tensor(special, dtype=torch.int64)[torch.arange(n // 4) % len(special)]
    k = min(n, len(special))
    bits[:k] = torch.tensor(special[:k], dtype=torch.int64)
    return ((bits + 2**31) % 2**32 - 2**31).to(torch.int32).view(torch.float32)


def _assert_same_bits(got, want):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    if want.element_size() == 2:
        gi, wi = got.view(torch.int16), want.view(torch.int16)
    else:
        gi, wi = got.view(torch.int32), want.view(torch.int32)
    assert torch.equal(gi[~nan], wi[~nan])


@pytest.mark.parametrize("n", [0, 1, 15, 17, 100, 70_001, 1_000_003])
@pytest.mark.parametrize("dst", [torch.bfloat16, torch.float16])
def test_cast_f32_to_16bit_bits(n, dst):
    # Round-to-nearest-even, ties, subnormals and NaN as PyTorch's CPU copy, on the SIMD and the
    # threaded paths (n past the 32K grain) and the masked tails.
    x = _special_f32(n, seed=n)
    xd = x.to(N)
    _assert_same_bits(xd.to(dst), x.to(dst))
    out = torch.empty(n, dtype=dst, device=N)
    out.copy_(xd)
    _assert_same_bits(out, x.to(dst))
    # And back: widening is exact.
    h = x.to(dst)
    _assert_same_bits(h.to(N).to(torch.float32), h.to(torch.float32))


def test_cast_layouts():
    x = _special_f32(2 * 333 * 301, seed=3).view(2, 333, 301)
    xd = x.to(N)
    for dst in (torch.bfloat16, torch.float16, torch.float64, torch.int32):
        for view in (lambda t: t, lambda t: t[:, :, ::2], lambda t: t.transpose(1, 2), lambda t: t[1:, 7:300],
                     lambda t: t.flip(-1), lambda t: t[:, :1, :].expand(2, 333, 301),
                     lambda t: t[:, :, :1].expand(2, 333, 301), lambda t: t[:, :0]):
            src_cpu = view(x)
            if dst == torch.int32:
                src_cpu = src_cpu.nan_to_num(0.0, 0.0, 0.0).clamp(-1e9, 1e9)
                src_dev = view(xd).nan_to_num(0.0, 0.0, 0.0).clamp(-1e9, 1e9)
            else:
                src_dev = view(xd)
            want = src_cpu.to(dst)
            _assert_same_bits(src_dev.to(dst), want) if dst != torch.float64 else \
                torch.testing.assert_close(src_dev.to(dst).cpu(), want, equal_nan=True, atol=0, rtol=0)
            out = torch.empty_strided(want.shape, tuple(reversed(want.stride())) if want.dim() == 2 else want.stride(),
                                      dtype=dst, device=N)
            out.copy_(src_dev)
            torch.testing.assert_close(out.cpu(), want, equal_nan=True, atol=0, rtol=0)
    # Narrow -> wide and same dtype, strided and threaded.
    b = x.to(torch.bfloat16)
    bd = b.to(N)
    for view in (lambda t: t, lambda t: t[:, ::3], lambda t: t.transpose(0, 2)):
        _assert_same_bits(view(bd).to(torch.float32), view(b).to(torch.float32))
        _assert_same_bits(view(bd).clone(), view(b).clone())
        _assert_same_bits(view(bd).contiguous(), view(b).contiguous())


@pytest.mark.parametrize("n", [1, 5, 16, 17, 31, 512, 513, 4099])
def test_silu_range(n):
    # The reciprocal-based division against CPU over the whole float range, including where e^-x
    # overflows (x < -88.7) or underflows, and non-finite inputs, at every tail length.
    g = torch.Generator().manual_seed(n)
    x = (torch.rand(n, generator=g, dtype=torch.float64) * 240 - 120).float()
    edge = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-38, -1e-38, -88.7, -88.8,
                         -87.3, -103.9, -104.5, 88.7, 89.5, 1e-7, -1e-7, 3.0, -3.0, 1e30, -1e30])
    x[: min(n, len(edge))] = edge[: min(n, len(edge))]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        check(F.silu, x.to(dtype))
    check(F.silu, x.view(1, n).expand(3, n))
    check(lambda t: F.silu(t.clone(), inplace=True), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                   torch.int32, torch.bool])
def test_broadcast_column(dtype):
    # An operand broadcast along the innermost dim (stride 0), converted once per row and replicated:
    # rows shorter and longer than one block, mixed dtypes, bool masks and conditions.
    for cols in (1, 7, 513, 1100):
        a = make((37, cols), dtype, seed=1)
        col = make((37, 1), dtype, seed=2)
        check(torch.mul, a, col)
        check(torch.add, col, a)
        check(torch.mul, a, col.float())
        check(torch.where, make((37, 1), torch.bool, seed=3), a, col)
        if dtype != torch.bool:
            check(lambda t, m: t.masked_fill(m, 3), a, make((37, 1), torch.bool, seed=4))
            check(torch.maximum, a.t(), col.t())
        if dtype.is_floating_point:
            # The ops whose kernels read a column-broadcast operand as one value per row, on either side,
            # with alpha, beside a strided operand, and as predicates.
            nz = torch.where(col == 0, torch.ones_like(col), col)
            check(torch.div, a, nz)
            check(torch.div, col, torch.where(a == 0, torch.ones_like(a), a))
            check(lambda x, y: torch.sub(x, y, alpha=2), a, col)
            check(lambda x, y: torch.add(x, y, alpha=0.5), col, a)
            check(torch.mul, a[:, ::2], col)
            check(torch.lt, a, col)
            check(torch.ge, col, a)
            check(torch.minimum, col, a)
            check(torch.pow, a.abs() + 0.5, col)
            out = torch.empty(37, cols, dtype=torch.float32)
            check(lambda x, y, o: torch.mul(x, y, out=o), a, col, out)  # a float result of 16-bit inputs


@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 100_003])
def test_bf16_fused_bits(n):
    # Contiguous all-bfloat16 add/sub/mul/div/silu run fused (widen, compute, round in registers): the
    # same bits as CPU, including subnormal and NaN results, alpha, in-place and out=.
    a = _special_f32(n, seed=1).to(torch.bfloat16)
    b = _special_f32(n, seed=2).to(torch.bfloat16)
    ad, bd = a.to(N), b.to(N)
    for fn in (torch.add, torch.sub, torch.mul, torch.div):
        _assert_same_bits(fn(ad, bd), fn(a, b))
    # With alpha CPU's own vector body (fused a + alpha * b) and scalar tail (alpha * b rounded first)
    # differ by an ulp; we fuse everywhere.
    for fn in (lambda x, y: torch.add(x, y, alpha=0.3), lambda x, y: torch.sub(x, y, alpha=3)):
        torch.testing.assert_close(fn(ad, bd).cpu(), fn(a, b), equal_nan=True)
    out = torch.empty(n, dtype=torch.bfloat16, device=N)
    _assert_same_bits(torch.mul(ad, bd, out=out), torch.mul(a, b))
    # Products that land in the subnormal range, where vcvtneps2bf16 alone would flush.
    s = torch.full((n,), 1e-20).to(torch.bfloat16)
    t = (torch.rand(n, generator=torch.Generator().manual_seed(5)) * 1e-19).to(torch.bfloat16)
    _assert_same_bits(torch.mul(s.to(N), t.to(N)), torch.mul(s, t))
    x = (torch.rand(n, generator=torch.Generator().manual_seed(6), dtype=torch.float64) * 40 - 20).to(torch.bfloat16)
    torch.testing.assert_close(F.silu(x.to(N)).cpu(), F.silu(x), atol=0, rtol=2 ** -7)
    xd = x.to(N)
    xd.mul_(bd)
    _assert_same_bits(xd, x * b)
    # Strided or mixed-dtype operands take the blocked path.
    _assert_same_bits(torch.add(ad[1::2], bd[::2][: n // 2]), torch.add(a[1::2], b[::2][: n // 2]))
    _assert_same_bits(torch.add(ad, bd.float()), torch.add(a, b.float()))


def test_pow_bfloat16_rounds_like_cpu():
    # PyTorch's CPU computes x**3 and x**-2 of bfloat16 in bfloat16 arithmetic (the square rounded first).
    x = (torch.rand(4096, generator=torch.Generator().manual_seed(0)) * 8).to(torch.bfloat16)
    xn = x.to("neuron")
    for e in (2.0, 3.0, -2.0, -1.0, 0.5, 1.5, 2.5, 4.0):
        assert torch.equal(xn.pow(e).cpu(), x.pow(e)), e


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rsqrt_reduced_rounds_like_cpu_in_every_layout(dtype):
    # PyTorch's CPU rounds a half/bfloat16 x**-0.5 one way in its vector loop (float 1/sqrt, one rounding)
    # and another in its scalar loop (sqrt rounded, then 1/that): which elements take which depends on the
    # layout and the vector width, so neuron runs CPU's kernel for these and gives its bits in every layout.
    g = torch.Generator().manual_seed(0)
    views = (lambda t: t, lambda t: t.reshape(-1)[::2], lambda t: t.reshape(-1)[1:], lambda t: t.transpose(0, -1))
    for shape in [(40,), (1, 2, 4, 5), (33,), (37, 53), (4096,)]:
        x = (torch.rand(shape, generator=g, dtype=torch.float64) * 50 + 1e-3).to(dtype)
        xd = x.to(N)
        for view in views:
            v, vd = view(x), view(xd)
            _assert_same_bits(torch.rsqrt(vd), torch.rsqrt(v))
            _assert_same_bits(vd.pow(-0.5), v.pow(-0.5))
            a, b = vd.clone(), v.clone()
            _assert_same_bits(a.pow_(-0.5), b.pow_(-0.5))


def test_normalize_p05_bfloat16_gradient_matches_cpu():
    # normalize with p=0.5 takes |x|**-0.5 in its backward (OpInfo sample #2 of nn.functional.normalize):
    # its bfloat16 gradient differed from CPU's by 2 ulps where CPU's scalar loop rounded x**-0.5.
    g = torch.Generator().manual_seed(3)
    for shape in [(1, 2, 4, 5), (3, 5, 7)]:
        x = (torch.randn(shape, generator=g) * 3).to(torch.bfloat16)
        go = torch.randn(shape, generator=g).to(torch.bfloat16)
        for view in (lambda t: t, lambda t: t.transpose(0, -1)):
            xc = view(x).detach().requires_grad_()
            xd = view(x.to(N)).detach().requires_grad_()
            yc = F.normalize(xc, p=0.5, dim=0)
            yd = F.normalize(xd, p=0.5, dim=0)
            torch.testing.assert_close(yd.cpu(), yc, atol=0, rtol=0)
            (gc,) = torch.autograd.grad(yc, xc, view(go))
            (gd,) = torch.autograd.grad(yd, xd, view(go.to(N)))
            torch.testing.assert_close(gd.cpu(), gc, atol=0, rtol=0)


def test_log_float32_correctly_rounded():
    # log evaluated in double and rounded once: the float of the exact value, for every magnitude.
    bits = torch.randint(1, 0x7F800000, (200_000,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    x = torch.cat([bits.view(torch.float32), torch.linspace(0.5, 2.0, 10001)])
    for v in (x, x[::3]):
        got = torch.log(v.to(N)).cpu()
        assert torch.equal(got, v.double().log().float())


def test_pow_exponent_gradient_no_worse_than_cpu():
    # d(x**y)/dy = x**y log(x), summed over a broadcast dimension: the terms' rounding errors add up, so
    # neuron's gradient must be no further from the float64 one than CPU's, plus the sweep's tolerance
    # (a 1-ulp log made it 2.6x CPU's error: OpInfo pow float32 sample #7 failed the sweep).
    g = torch.Generator().manual_seed(1)
    for seed in range(4):
        x = torch.rand(10, 1, 5, generator=g) * 9 + 0.1
        y = (torch.rand(1, 10, 5, generator=g) * 6 - 3)
        go = torch.randn(10, 10, 5, generator=g)
        grads = []
        for dev, dt in (("cpu", torch.float32), (N, torch.float32), ("cpu", torch.float64)):
            yy = y.to(dev, dt).requires_grad_()
            (gy,) = torch.autograd.grad(torch.pow(x.to(dev, dt), yy), yy, go.to(dev, dt))
            grads.append(gy.cpu().double())
        c, d, r = grads
        assert bool(((d - r).abs() <= (c - r).abs() + 1e-5 + 1.3e-6 * r.abs()).all()), seed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_add_sub_alpha_reduced_equal_cpu_in_every_layout(dtype):
    # PyTorch's CPU computes a half/bfloat16 a + alpha * b in float in its vector loop but rounds alpha * b to the
    # dtype first in its scalar loop (each thread chunk's last elements, a small tensor whole): with alpha != 1
    # neuron runs CPU's kernel and gives its bits wherever an element falls (the OpInfo sample was add, fp16,
    # alpha -3.125, a 5x5 input broadcast from its first row).
    g = torch.Generator().manual_seed(0)
    for shape in [(5, 5), (37, 53), (100000,)]:
        x = (torch.randn(shape, generator=g) * 10).to(dtype)
        y = (torch.randn(shape, generator=g) * 10).to(dtype)
        xd, yd = x.to(N), y.to(N)
        for alpha in (-3.125, 0.3, 2):
            for op in (torch.add, torch.sub):
                _assert_same_bits(op(xd, yd, alpha=alpha), op(x, y, alpha=alpha))
                _assert_same_bits(op(xd[:1].expand(shape), yd, alpha=alpha), op(x[:1].expand(shape), y, alpha=alpha))
                _assert_same_bits(op(xd.t(), yd.t(), alpha=alpha), op(x.t(), y.t(), alpha=alpha))
            a, b = xd.clone(), x.clone()
            _assert_same_bits(a.add_(yd, alpha=alpha), b.add_(y, alpha=alpha))
