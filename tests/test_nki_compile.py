"""The NKI fast path (nki/_compile.py + csrc/kernels/nki_exec.c): each kernel runs with the fast path off (the
interpreter, the reference) and on (traced on the first call, replayed in C after), and the replay must give the
interpreter's result: bitwise where both compute the same operations in the same order (copies, element-wise
fp32 math with one rounding, max reductions, GEMM tiles whose K fits one micro-kernel pass), else within a tight
tolerance whose reason is given at the call. Every test also checks that the call was replayed, not interpreted,
so a lowering that silently falls back fails here."""

import importlib.util
import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest

import nki
import nki.isa as nisa
import nki.language as nl
from test_nki import matmul_old_api, roundtrip, softmax_rows, transpose_tiles  # the kernels both modes run
from nki import _compile

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent


def _dev():
    import torch_neuronx  # noqa: F401

    if not hasattr(torch, "neuron") or torch.neuron.device_count() == 0:
        pytest.skip("no neuron device")
    if _compile._executor() is None:
        pytest.skip("torch_neuronx._C has no _nki_exec")
    return torch.device("neuron")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("NKI_COMPILE", "1")
    nki.reset_compile_cache()
    yield
    nki.reset_compile_cache()


def _cpu(r):
    if isinstance(r, (list, tuple)):
        return type(r)(_cpu(x) for x in r)
    return r.cpu().clone() if isinstance(r, torch.Tensor) else r


def both(kernel, make_args, monkeypatch, calls=2):
    """(interpreted result, replayed result); make_args() builds fresh device arguments for each call (kernels
    may write into them). Asserts the replayed calls really ran the compiled plan."""
    monkeypatch.setenv("NKI_COMPILE", "0")
    ref = _cpu(kernel(*make_args()))
    monkeypatch.setenv("NKI_COMPILE", "1")
    first = _cpu(kernel(*make_args()))  # traced: runs the interpreter while recording
    st = nki.compile_stats()
    assert st["fallbacks"] == [], st["fallbacks"]
    out = None
    for _ in range(calls - 1):
        before = nki.compile_stats()["compiled_calls"]
        out = _cpu(kernel(*make_args()))
        assert nki.compile_stats()["compiled_calls"] == before + 1, nki.compile_stats()
    _same(first, ref)
    return ref, out


def _same(a, b):
    if isinstance(a, (list, tuple)):
        for x, y in zip(a, b):
            _same(x, y)
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def _bench():
    spec = importlib.util.spec_from_file_location("bench_nki_for_tests", ROOT / "benchmarks" / "bench_nki.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------------------------- nisa kernels
@nki.jit
def add_grid(a, b):
    c = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i, j = nl.program_id(0), nl.program_id(1)
    rows, cols = slice(i * 128, (i + 1) * 128), slice(j * 64, (j + 1) * 64)
    ta = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray((128, 64), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a[rows, cols])
    nisa.dma_copy(dst=tb, src=b[rows, cols])
    tc = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=tc, data1=ta, data2=tb, op=nl.add)
    nisa.dma_copy(dst=c[rows, cols], src=tc)
    return c


@nki.jit
def matmul_tiled(lhsT, rhs):
    """K accumulated in PSUM over nc_matmul calls (the first write of a group overwrites, the next add)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 256):
            acc = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
            for k in nl.sequential_range(K // 128):
                a = nl.ndarray((nl.par_dim(128), 128), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((128, 256), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
                nisa.dma_copy(dst=b, src=rhs[nl.ds(k * 128, 128), nl.ds(n * 256, 256)])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            o = nl.ndarray((128, 256), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o, src=acc)
            nisa.dma_copy(dst=result[m * 128:(m + 1) * 128, n * 256:(n + 1) * 256], src=o)
    return result


@nki.jit
def rmsnorm_isa(x, w, eps):
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    wt = nl.ndarray((1, D), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w.reshape((1, D)))
    for i in nl.affine_range(N // 128):
        xt = nl.ndarray((128, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * 128:(i + 1) * 128, :])
        sq = nl.ndarray((128, D), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=ss,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rs = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rs, data=ss, op0=nl.multiply, operand0=1.0 / D, op1=nl.add, operand1=eps)
        nisa.activation(dst=rs, op=nl.rsqrt, data=rs)
        y = nl.ndarray((128, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=xt, op0=nl.multiply, operand0=rs)
        nisa.tensor_tensor(dst=y, data1=y, data2=wt.broadcast(0, 128), op=nl.multiply)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out


@nki.jit
def reductions_isa(x):
    """Row max (negated), row sum and row mean with tensor_reduce, into one [P, 3] output."""
    P, F = x.shape
    out = nl.ndarray((P, 3), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray((P, 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r[:, 0:1], op=nl.maximum, data=t, axis=1, negate=True, keepdims=True)
    nisa.tensor_reduce(dst=r[:, 1:2], op=nl.add, data=t, axis=1, keepdims=True)
    nisa.tensor_reduce(dst=r[:, 2:3], op=nl.minimum, data=t, axis=1, keepdims=True)
    nisa.dma_copy(dst=out, src=r)
    return out


@nki.jit
def activations_isa(x):
    P, F = x.shape
    out = nl.ndarray((4, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    for i, op in enumerate((nl.exp, nl.tanh, nl.relu, nl.sigmoid)):
        o = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=o, op=op, data=t)
        nisa.dma_copy(dst=out[i], src=o)
    return out


@nki.jit
def mul_into_bf16(a, b):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    s = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=s, data1=ta, data2=tb, op=nl.multiply)  # fp32 math, one bf16 rounding
    nisa.dma_copy(dst=out, src=s)
    return out


# ----------------------------------------------------------------------------------------------- tests
def _randn(*shape, seed=0, dtype=torch.float32, dev=None):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(dev)


def test_add_grid_program_id(monkeypatch):
    dev = _dev()
    a, b = _randn(256, 128, seed=1), _randn(256, 128, seed=2)
    ref, out = both(add_grid[2, 2], lambda: (a.to(dev), b.to(dev)), monkeypatch)
    _same(out, ref)
    _same(out, a + b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_psum_accumulation(monkeypatch, dtype):
    dev = _dev()
    lhsT, rhs = _randn(384, 256, seed=3, dtype=dtype), _randn(384, 512, seed=4, dtype=dtype)
    ref, out = both(matmul_tiled, lambda: (lhsT.to(dev), rhs.to(dev)), monkeypatch)
    # Each [128 x 256] tile of K=128 is one fp32 GEMM in both (numpy's BLAS and the library's micro-kernel) and
    # their sums over K differ only by the order inside a dot product: a few fp32 ulps of the dot's magnitude.
    torch.testing.assert_close(out.float(), ref.float(), rtol=1e-5, atol=1e-4 * 384 ** 0.5
                               if dtype == torch.float32 else 1e-2)
    if dtype == torch.bfloat16:  # one bf16 rounding of nearly equal fp32 sums: at most one bf16 ulp apart
        assert ((out.float() - ref.float()).abs() <= ref.float().abs() * 2 ** -7 + 1e-30).all()


def test_rmsnorm_isa(monkeypatch):
    dev = _dev()
    x, w = _randn(256, 320, seed=5), _randn(320, seed=6)
    ref, out = both(rmsnorm_isa, lambda: (x.to(dev), w.to(dev), 1e-6), monkeypatch)
    # the row sum of squares is a reduction: numpy sums pairwise, the library in SIMD lanes
    torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-6)


def test_transpose(monkeypatch):
    dev = _dev()
    x = _randn(256, 384, seed=7)
    ref, out = both(transpose_tiles, lambda: (x.to(dev),), monkeypatch)
    _same(out, ref)
    _same(out, x.T.contiguous())


def test_reductions(monkeypatch):
    dev = _dev()
    x = _randn(128, 1000, seed=8)
    ref, out = both(reductions_isa, lambda: (x.to(dev),), monkeypatch)
    _same(out[:, 0], ref[:, 0])  # max/min: exact whatever the order
    _same(out[:, 2], ref[:, 2])
    torch.testing.assert_close(out[:, 1], ref[:, 1], rtol=1e-5, atol=1e-5)  # a sum: order differs


def test_activations(monkeypatch):
    dev = _dev()
    x = _randn(128, 300, seed=9) * 4
    ref, out = both(activations_isa, lambda: (x.to(dev),), monkeypatch)
    _same(out[2], ref[2])  # relu is exact
    # exp/tanh/sigmoid: the library's vector polynomials vs numpy's libm, within a few fp32 ulps
    torch.testing.assert_close(out, ref, rtol=4e-6, atol=1e-6)


@pytest.mark.parametrize("dt", [nl.bfloat16, nl.float16])
def test_rounding_on_store(monkeypatch, dt):
    dev = _dev()
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((64, 257)) * 10 ** rng.uniform(-8, 8, (64, 257))).astype(np.float32)
    x[0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    x[1, :3] = [1.00390625, 1.01171875, 3.3895314e38]  # ties to even, bf16 overflow to inf
    x[2, :2] = [70000.0, -1e-8]
    xt = torch.from_numpy(x)
    ref, out = both(roundtrip, lambda: (xt.to(dev), dt), monkeypatch)
    _same(out, ref)
    tdt = torch.bfloat16 if dt is nl.bfloat16 else torch.float16
    _same(out, xt.to(tdt).float())


def test_compute_rounded_once_to_bf16(monkeypatch):
    dev = _dev()
    a, b = _randn(32, 40, seed=10), _randn(32, 40, seed=11)
    ref, out = both(mul_into_bf16, lambda: (a.to(dev), b.to(dev)), monkeypatch)
    _same(out, ref)
    _same(out, (a * b).to(torch.bfloat16).float())


def test_bench_kernels_replay(monkeypatch):
    dev = _dev()
    bench = _bench()
    lhsT, rhs = _randn(256, 256, seed=12), _randn(256, 512, seed=13)
    ref, out = both(bench.matmul_kernel, lambda: (lhsT.to(dev), rhs.to(dev)), monkeypatch)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)  # dot-product order inside each K=128 tile
    a, b = _randn(256, 1024, seed=14), _randn(256, 1024, seed=15)
    ref, out = both(bench.add_kernel[2, 2], lambda: (a.to(dev), b.to(dev)), monkeypatch)
    _same(out, ref)


def test_limit_error_same_with_fast_path(monkeypatch):
    dev = _dev()

    @nki.jit
    def too_wide(x):
        out = nl.ndarray((64, 600), dtype=x.dtype, buffer=nl.shared_hbm)
        a = nl.ndarray((64, 64), dtype=x.dtype, buffer=nl.sbuf)
        b = nl.ndarray((64, 600), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x[:, 0:64])
        nisa.dma_copy(dst=b, src=x)
        acc = nl.ndarray((64, 600), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=a, moving=b)  # LIMIT-FAST
        return out

    line = next(i + 1 for i, l in enumerate(open(__file__)) if l.rstrip().endswith("# LIMIT-FAST"))
    x = torch.zeros(64, 600, device=dev)
    msgs = []
    for env in ("0", "1", "1"):
        monkeypatch.setenv("NKI_COMPILE", env)
        with pytest.raises(nki.NkiError) as e:
            too_wide(x)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1] == msgs[2], msgs
    assert "moving free dimension" in msgs[0] and re.search(r"\b600\b", msgs[0]), msgs[0]
    assert f"test_nki_compile.py:{line}" in msgs[0], msgs[0]
    assert nki.compile_stats()["compiled_calls"] == 0


def test_numpy_and_simulate_stay_interpreted(monkeypatch):
    _dev()
    a = np.ones((256, 128), np.float32)
    add_grid[2, 2](a, a)
    add_grid[2, 2](a, a)
    nki.simulate(add_grid[2, 2])(torch.ones(256, 128), torch.ones(256, 128))
    st = nki.compile_stats()
    assert st["compiled_calls"] == 0 and st["traces"] == 0, st


def test_unlowerable_kernel_falls_back(monkeypatch):
    dev = _dev()

    @nki.jit
    def int_math(x):
        out = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, nl.softplus(t))  # softplus of an integer tile (numpy's float64 logaddexp) has no lowering
        return out

    x = torch.arange(-64, 64, dtype=torch.int32).reshape(8, 16).to(dev)
    r1, r2 = int_math(x).cpu(), int_math(x).cpu()
    st = nki.compile_stats()
    assert st["compiled_calls"] == 0 and st["interpreted_calls"] == 2 and len(st["fallbacks"]) == 1, st
    assert "test_nki_compile.py:" in st["fallbacks"][0][1], st["fallbacks"]
    expect = torch.nn.functional.softplus(x.cpu().double()).round().int()
    _same(r1, expect)
    _same(r2, expect)


@pytest.mark.parametrize("dtype", ["int32", "float32", "bfloat16"])
def test_iota_replays(monkeypatch, dtype):
    """nisa.iota (both forms): values fixed by the shapes, replayed as a copy from the constant pool."""
    dev = _dev()

    @nki.jit
    def iota_kernel(x):
        out = nl.ndarray((128, 16), dtype=getattr(nl, dtype), buffer=nl.shared_hbm)
        io = nl.ndarray((128, 16), dtype=getattr(nl, dtype), buffer=nl.sbuf)
        nisa.iota(dst=io, pattern=[[1, 16]], offset=3, channel_multiplier=100)
        nisa.dma_copy(dst=out, src=io)
        old = nl.ndarray((4, 16), dtype=nl.int32, buffer=nl.shared_hbm)
        i = nl.mgrid[0:4, 0:16]
        nl.store(old, nisa.iota(i.p * 16 + i.x, dtype=nl.int32))
        return out, old

    ref, out = both(iota_kernel, lambda: (torch.zeros(1, device=dev),), monkeypatch)
    _same(out, ref)
    expect = torch.from_numpy((3 + 100 * np.arange(128)[:, None] + np.arange(16)[None, :]).astype(np.int32))
    _same(out[0], expect.to(out[0].dtype))
    _same(out[1], torch.arange(64, dtype=torch.int32).reshape(4, 16))


def test_select_where_affine_select_replay(monkeypatch):
    """nisa.select (tile predicate), nl.where (a comparison tile and a scalar side), nisa.affine_select (a causal
    mask from an affine pattern, new and older forms): the false side copied, the true side copied where the
    predicate holds; bitwise the interpreter's."""
    dev = _dev()

    @nki.jit
    def sel(x, y):
        P, F = x.shape
        out = nl.ndarray((4, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
        a = nl.load(x)
        b = nl.load(y)
        p = nl.greater(a, b)
        s = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.select(dst=s, predicate=p, on_true=a, on_false=b)
        nl.store(out[0], s)
        nl.store(out[1], nl.where(p, a, -1.5))
        c = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.affine_select(dst=c, pattern=[[-1, F]], channel_multiplier=1, on_true_tile=a,
                           on_false_value=-9984.0, cmp_op=nl.greater_equal)
        nl.store(out[2], c)
        i = nl.mgrid[0:P, 0:F]
        nl.store(out[3], nisa.affine_select(i.p - i.x >= 0, a, -9984.0))
        return out

    for dt in (torch.float32, torch.bfloat16):
        x, y = _randn(64, 64, seed=54, dtype=dt), _randn(64, 64, seed=55, dtype=dt)
        ref, out = both(sel, lambda: (x.to(dev), y.to(dev)), monkeypatch)
        _same(out, ref)
        _same(out[0], torch.maximum(x, y))
        _same(out[1], torch.where(x > y, x, torch.tensor(-1.5, dtype=dt)))
        causal = torch.where(torch.ones(64, 64, dtype=torch.bool).tril(), x, torch.tensor(-9984.0, dtype=dt))
        _same(out[2], causal)
        _same(out[3], causal)
        nki.reset_compile_cache()


def test_threads_different_shapes(monkeypatch):
    """Two threads call one kernel with different shapes at once (traces and replays interleave): each gets
    its own plan, every result is right, and every call after the first of a shape replays."""
    dev = _dev()
    shapes = {0: (128, 64), 1: (384, 192)}
    inputs = {k: (_randn(*s, seed=20 + k).to(dev), _randn(*s, seed=30 + k).to(dev)) for k, s in shapes.items()}
    expect = {k: (a.cpu() + b.cpu()) for k, (a, b) in inputs.items()}
    errors = []
    barrier = threading.Barrier(2)
    n = 12

    def work(k):
        try:
            a, b = inputs[k]
            grid = add_grid[shapes[k][0] // 128, shapes[k][1] // 64]
            barrier.wait()
            for _ in range(n):
                r = grid(a, b)
                if not torch.equal(r.cpu(), expect[k]):
                    errors.append((k, "wrong result"))
        except Exception as e:  # noqa: BLE001
            errors.append((k, repr(e)))

    ts = [threading.Thread(target=work, args=(k,)) for k in shapes]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    st = nki.compile_stats()
    assert st["fallbacks"] == [], st
    assert st["compiled_calls"] + st["interpreted_calls"] == 2 * n, st
    assert st["compiled_calls"] >= 2 * (n - 2), st  # a shape may be traced by at most a couple of its calls


# ----------------------------------------------------------------------------------------------- the nl tile API
@nki.jit
def tile_math(x, y):
    """nl element-wise math, scalars on either side, partition broadcast, reductions, transpose, nl.matmul."""
    P, F = x.shape
    out = nl.ndarray((6, P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    red = nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    tr = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.shared_hbm)
    mm = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.shared_hbm)
    a, b = nl.load(x), nl.load(y)
    nl.store(out[0], (a + b) * 2.0 - 1.5 / (nl.abs(b) + 1.0))
    nl.store(out[1], nl.maximum(a, b) - nl.minimum(a, 0.25) + nl.square(a) + -a)
    nl.store(out[2], nl.relu(a) * nl.sigmoid(b) + nl.tanh(a) - nl.sqrt(nl.abs(b)) + nl.rsqrt(nl.abs(a) + 1.0))
    nl.store(out[3], nl.greater(a, b) + nl.less_equal(a, 0.0) + nl.equal(a, a))
    mx = nl.max(a, axis=1)  # [P]: broadcast along the free axis
    nl.store(out[4], nl.subtract(a, mx))
    nl.store(out[5], nl.exp(a) * nl.reciprocal(nl.sum(nl.exp(a), axis=1, keepdims=True)))
    nl.store(red[:, 0:1], nl.max(a, axis=1, keepdims=True))
    nl.store(red[:, 1:2], nl.min(b, axis=[1], keepdims=True))
    nl.store(red[:, 2:3], nl.sum(a, axis=1, keepdims=True))
    nl.store(red[:, 3:4], nl.mean(b, axis=1, keepdims=True))
    nl.store(tr, nl.transpose(a))
    nl.store(mm, nl.matmul(a, nl.transpose(b)))
    return out, red, tr, mm


@nki.jit
def bf16_tile_math(x):
    out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    t = nl.load(x, dtype=nl.bfloat16)  # rounded on the load
    u = nl.multiply(t, 3.0, dtype=nl.bfloat16)  # fp32 math, rounded once
    nl.store(out, nl.add(u, t))  # promote(bf16, bf16) = bf16, rounded on the store
    return out


def test_nl_softmax(monkeypatch):
    dev = _dev()
    x = _randn(256, 200, seed=40)
    ref, out = both(softmax_rows, lambda: (x.to(dev),), monkeypatch)
    # exp: the library's vector polynomial vs numpy's; the row sum: SIMD lanes vs numpy's pairwise order
    torch.testing.assert_close(out, ref, rtol=4e-6, atol=1e-7)


def test_nl_matmul_older_api(monkeypatch):
    dev = _dev()
    lhsT, rhs = _randn(256, 64, seed=41), _randn(256, 96, seed=42)
    ref, out = both(matmul_old_api, lambda: (lhsT.to(dev), rhs.to(dev)), monkeypatch)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)  # dot-product order inside each K=128 GEMM


def test_nl_tile_math(monkeypatch):
    dev = _dev()
    x, y = _randn(96, 80, seed=43), _randn(96, 80, seed=44)
    ref, out = both(tile_math, lambda: (x.to(dev), y.to(dev)), monkeypatch)
    (o, r, t, m), (o_ref, r_ref, t_ref, m_ref) = out, ref
    for i in (0, 1, 3, 4):  # add/mul/div/max/min/square/negate/compare: one fp32 operation each, exact
        _same(o[i], o_ref[i])
    # sigmoid/tanh/sqrt/rsqrt/exp: vector polynomials vs libm; the row sums: SIMD vs pairwise order
    torch.testing.assert_close(o, o_ref, rtol=4e-6, atol=1e-6)
    _same(r[:, :2], r_ref[:, :2])  # max/min
    torch.testing.assert_close(r, r_ref, rtol=1e-5, atol=1e-6)
    _same(t, t_ref)
    torch.testing.assert_close(m, m_ref, rtol=1e-5, atol=1e-5)


def test_nl_bf16(monkeypatch):
    dev = _dev()
    x = _randn(64, 130, seed=45)
    ref, out = both(bf16_tile_math, lambda: (x.to(dev),), monkeypatch)
    _same(out, ref)


def test_bench_nl_kernels_replay(monkeypatch):
    dev = _dev()
    bench = _bench()
    x, w = _randn(256, 512, seed=46), _randn(512, seed=47)
    ref, out = both(bench.rmsnorm_kernel, lambda: (x.to(dev), w.to(dev)), monkeypatch)
    torch.testing.assert_close(out, ref, rtol=4e-6, atol=1e-6)  # the row sum of squares: order
    ref, out = both(bench.softmax_kernel, lambda: (x.to(dev),), monkeypatch)
    torch.testing.assert_close(out, ref, rtol=4e-6, atol=1e-7)  # exp and the row sum


def test_nl_inplace_store_into_argument(monkeypatch):
    dev = _dev()

    @nki.jit
    def scale_inplace(x):
        t = nl.load(x)
        nl.store(x, t * 2.0)
        return x

    base = torch.arange(64.0).reshape(8, 8)
    ref, out = both(scale_inplace, lambda: (base.to(dev)[::2, 1:5],), monkeypatch)
    _same(out, ref)
    x = base.to(dev)
    view = x[::2, 1:5]
    r = scale_inplace(view)
    assert r.data_ptr() == view.data_ptr()
    expect = base.clone()
    expect[::2, 1:5] *= 2
    _same(x.cpu(), expect)


@pytest.mark.parametrize("shape", [(200, 64), (7, 130), (129, 33)])
def test_nl_tail_tile_mask(monkeypatch, shape):
    """A tail tile (mask rows < R) is lowered: the load and the store copy the box of rows the mask keeps, the
    rest of the tile keeps its NaN fill through the row math, as in the interpreter."""
    dev = _dev()
    x = _randn(*shape, seed=48)
    ref, out = both(softmax_rows, lambda: (x.to(dev),), monkeypatch)
    torch.testing.assert_close(out, ref, rtol=4e-6, atol=1e-7)  # exp and the row sum, as test_nl_softmax
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


def test_nl_masked_columns_and_fill(monkeypatch):
    """Masks over the free axis and a masked scalar store: boxes too."""
    dev = _dev()

    @nki.jit
    def k(x):
        P, F = x.shape
        out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
        i = nl.mgrid[0:P, 0:F]
        nl.store(out, 0.0)
        t = nl.load(x[i.p, i.x], mask=(i.x < F - 3))  # the last 3 columns stay NaN in t
        nl.store(out[i.p, i.x], value=nl.multiply(t, 2.0), mask=(i.x >= 2) & (i.x < F - 3))
        nl.store(out[i.p, i.x], value=-1.0, mask=(i.p < 2))
        return out

    x = _randn(16, 40, seed=52)
    ref, out = both(k, lambda: (x.to(dev),), monkeypatch)
    _same(out, ref)
    expect = torch.zeros(16, 40)
    expect[:, 2:37] = x[:, 2:37] * 2
    expect[:2] = -1
    _same(out, expect)


def test_nl_mask_not_a_box_replays(monkeypatch):
    """A triangular mask is no box of the tile: replayed with the mask as a predicate tile (was interpreted)."""
    dev = _dev()

    @nki.jit
    def tri(x):
        P, F = x.shape
        out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
        i = nl.mgrid[0:P, 0:F]
        nl.store(out, 0.0)
        nl.store(out[i.p, i.x], value=nl.load(x), mask=(i.x <= i.p))
        return out

    x = _randn(8, 8, seed=53)
    ref, out = both(tri, lambda: (x.to(dev),), monkeypatch)
    _same(out, ref)
    _same(out, torch.tril(x))


def test_nl_older_idioms(monkeypatch):
    dev = _dev()

    @nki.jit
    def k(lhsT, rhs):
        K, M = lhsT.shape
        _, N = rhs.shape
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        a = nl.load(lhsT)
        b = nl.load(rhs)
        acc = nl.ndarray((2, nl.par_dim(M), N), dtype=nl.float32, buffer=nl.psum)
        for r in nl.affine_range(2):
            acc[1] += nisa.nc_matmul(a, b)
        s = nisa.tensor_copy(acc[1], dtype=nl.float32)
        mx = nl.max(s, axis=1)
        nl.store(out, nl.subtract(s, mx))
        return out

    g = torch.Generator().manual_seed(49)
    lhsT = torch.randint(-2, 3, (64, 32), generator=g).float()
    rhs = torch.randint(-2, 3, (64, 48), generator=g).float()
    ref, out = both(k, lambda: (lhsT.to(dev), rhs.to(dev)), monkeypatch)
    _same(out, ref)  # small integers: every order is exact

    @nki.jit
    def ids(out):
        i = nl.program_id(0)
        t = nl.full((1, 1), i, dtype=nl.int32)
        nl.store(out[i:i + 1, :], t)
        return out

    ref, out = both(ids[nl.spmd_dim(3, nl.nc(2))], lambda: (torch.full((6, 1), -1, dtype=torch.int32).to(dev),),
                    monkeypatch)
    _same(out, ref)
    _same(out[:, 0], torch.arange(6, dtype=torch.int32))


def test_optimizer_forwards_loads_and_stores(monkeypatch):
    """add_grid records, per program, two NaN fills + two loads + the add + a fill and a store of the result
    tile (and one fill of the output): the optimizer leaves one add per program reading and writing HBM."""
    dev = _dev()
    a, b = _randn(256, 128, seed=50), _randn(256, 128, seed=51)
    monkeypatch.setenv("NKI_MERGE", "0")
    both(add_grid[2, 2], lambda: (a.to(dev), b.to(dev)), monkeypatch)
    (plan,) = [p for p in _compile._PLANS.values() if p is not _compile._INTERPRET]
    assert plan.steps == 4 and set(plan.ins["kind"].tolist()) == {_compile.BINARY}, plan.ins["kind"]
    monkeypatch.delenv("NKI_MERGE")
    nki.reset_compile_cache()
    ref, out = both(add_grid[2, 2], lambda: (a.to(dev), b.to(dev)), monkeypatch)
    (plan,) = [p for p in _compile._PLANS.values() if p is not _compile._INTERPRET]
    # the four programs' adds cover adjacent [128, 64] blocks of one [256, 128] tensor: one step
    assert plan.steps == 1 and plan.ins[0]["kind"] == _compile.BINARY, plan.ins["kind"]
    assert plan.ins[0]["o"][0]["sizes"][:2].tolist() == [256, 128]
    _same(out, a + b)
    nki.reset_compile_cache()
    monkeypatch.setenv("NKI_COMPILE_OPT", "0")
    nki.reset_compile_cache()
    ref, out = both(add_grid[2, 2], lambda: (a.to(dev), b.to(dev)), monkeypatch)
    (plan,) = [p for p in _compile._PLANS.values() if p is not _compile._INTERPRET]
    assert plan.steps > 16
    _same(out, a + b)


def test_optimizer_keeps_overlapping_shift(monkeypatch):
    """x[:, 1:] = x[:, :-1] through a tile: forwarding the load would make one overlapping copy."""
    dev = _dev()

    @nki.jit
    def shift(x):
        P, F = x.shape
        t = nl.load(x[:, 0:F - 1])
        nl.store(x[:, 1:F], t)
        u = nl.load(x)
        nl.store(x, nl.add(u, u))  # in place, element by element: forwarding is fine
        return x

    base = torch.arange(40.0).reshape(4, 10)
    ref, out = both(shift, lambda: (base.clone().to(dev),), monkeypatch)
    _same(out, ref)
    expect = base.clone()
    expect[:, 1:] = base[:, :-1]
    _same(out, expect * 2)


@nki.jit
def rmsnorm_fuse(x, w):
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    iw = nl.arange(1)[:, None]
    iy = nl.arange(D)[None, :]
    wt = nl.load(w.reshape((1, D))[iw, iy])
    ix = nl.arange(128)[:, None]
    for i in nl.affine_range((N + 127) // 128):
        rows = i * 128 + ix
        t = nl.load(x[rows, iy], mask=(rows < N))
        ss = nl.sum(nl.square(t), axis=1, keepdims=True)
        r = nl.rsqrt(nl.add(nl.multiply(ss, 1.0 / D), 1e-6))
        nl.store(out[rows, iy], value=nl.multiply(nl.multiply(t, r), wt.broadcast_to((128, D))), mask=(rows < N))
    return out


@nki.jit
def softmax_fuse(x):
    R, C = x.shape
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    ix = nl.mgrid[0:128, 0:C]
    for r in nl.affine_range((R + 127) // 128):
        rows = r * 128 + ix.p
        t = nl.load(x[rows, ix.x], mask=(rows < R))
        mx = nl.max(t, axis=1, keepdims=True)
        e = nl.exp(nl.subtract(t, mx))
        s = nl.sum(e, axis=1, keepdims=True)
        nl.store(out[rows, ix.x], value=nl.multiply(e, nl.reciprocal(s)), mask=(rows < R))
    return out


@pytest.mark.parametrize("name", ["rmsnorm", "softmax"])
def test_fused_row_blocks(monkeypatch, name):
    """Fused (the default; NKI_FUSE=0 turns it off): chains of element-wise steps and free-axis reduces replay a
    block of rows at a time through the same vector loops and row reductions, so bitwise equal to the unfused
    replay."""
    dev = _dev()
    x = _randn(256, 1000, seed=31)
    w = _randn(1000, seed=32)
    kern, mk = (rmsnorm_fuse, lambda: (x.to(dev), w.to(dev))) if name == "rmsnorm" else \
        (softmax_fuse, lambda: (x.to(dev),))
    _compile.reset()
    monkeypatch.setenv("NKI_FUSE", "0")
    _, plain = both(kern, mk, monkeypatch)
    assert nki.compile_stats()["fused_groups"] == 0
    _compile.reset()
    monkeypatch.setenv("NKI_FUSE", "1")
    ref, fused = both(kern, mk, monkeypatch)
    assert nki.compile_stats()["fused_groups"] > 0
    _same(fused, plain)
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-6)


@nki.jit
def chain_isa(x, w):
    """tensor_scalar -> activation with a row sum -> tensor_tensor with a partition-broadcast row -> tensor_copy
    rounding to x's dtype -> row max -> subtract it: one fused group per call, intermediates in scratch."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    stats = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    wt = nl.ndarray((1, F), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w.reshape((1, F)))
    a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=a, data=t, op0=nl.multiply, operand0=0.5, op1=nl.add, operand1=0.25)
    b = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    s = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=b, op=nl.tanh, data=a, reduce_op=nl.add, reduce_res=s,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    c = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=c, data1=b, data2=wt.broadcast(0, P), op=nl.multiply)
    d = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=c)
    m = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=m, op=nl.maximum, data=d, axis=1, keepdims=True)
    nisa.tensor_scalar(dst=d, data=d, op0=nl.subtract, operand0=m)
    nisa.dma_copy(dst=out, src=d)
    st = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=st[:, 0:1], src=s)
    nisa.tensor_copy(dst=st[:, 1:2], src=m)
    nisa.dma_copy(dst=stats, src=st)
    return out, stats


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(96, 1000), (7, 33), (128, 130), (2, 1)])
def test_fused_chain_odd_shapes(monkeypatch, shape, dtype):
    """The fused executor (default) on partition counts below 128 and free sizes that are no multiple of the
    vector width, fp32 and bf16 tiles: bitwise equal to the step-by-step replay (the same vector loops, row
    reductions and roundings), and equal to the interpreter within the vector math's error."""
    dev = _dev()
    P, F = shape
    x = _randn(P, F, seed=60, dtype=dtype)
    w = _randn(F, seed=61)
    mk = lambda: (x.to(dev), w.to(dev))  # noqa: E731
    _compile.reset()
    monkeypatch.setenv("NKI_FUSE", "0")
    _, plain = both(chain_isa, mk, monkeypatch)
    assert nki.compile_stats()["fused_groups"] == 0
    _compile.reset()
    monkeypatch.setenv("NKI_FUSE", "1")
    ref, fused = both(chain_isa, mk, monkeypatch)
    if P > 1:
        assert nki.compile_stats()["fused_groups"] > 0
        (plan,) = [p for p in _compile._PLANS.values() if p is not _compile._INTERPRET]
        assert (plan.ins["o"]["pad"] > 0).any()  # intermediates kept in scratch blocks
    _same(fused, plain)
    # tanh: the library's vector polynomial vs numpy (a bf16 rounding may flip by one unit); the row sum: order
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(fused[0].float(), ref[0].float(), **tol)
    torch.testing.assert_close(fused[1], ref[1], rtol=1e-5, atol=1e-4 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_bench_kernels_bf16_fp32(monkeypatch, dtype):
    """rmsnorm and softmax of the tile API, 128-row tiles over 384 rows of 1000 (fp32 and bf16): fused by
    default, bitwise equal to the unfused replay."""
    dev = _dev()
    x = _randn(384, 1000, seed=62, dtype=dtype)
    w = _randn(1000, seed=63, dtype=dtype)
    for kern, mk in ((rmsnorm_fuse, lambda: (x.to(dev), w.to(dev))), (softmax_fuse, lambda: (x.to(dev),))):
        _compile.reset()
        monkeypatch.setenv("NKI_FUSE", "0")
        _, plain = both(kern, mk, monkeypatch)
        _compile.reset()
        monkeypatch.delenv("NKI_FUSE")
        ref, fused = both(kern, mk, monkeypatch)
        assert nki.compile_stats()["fused_groups"] > 0
        _same(fused, plain)
        tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(fused.float(), ref.float(), **tol)


def test_copy_predicated_replays(monkeypatch):
    """nisa.tensor_copy_predicated (a tile predicate, reversed, and a scalar source): NKX_COPY_IF in place."""
    dev = _dev()

    @nki.jit
    def k(x, y):
        P, F = x.shape
        out = nl.ndarray((2, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
        a = nl.load(x)
        b = nl.load(y)
        p = nl.greater(a, 0.0)
        d = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=d, src=b)
        nisa.tensor_copy_predicated(dst=d, src=a, predicate=p)
        nl.store(out[0], d)
        nisa.tensor_copy_predicated(dst=d, src=a, predicate=p, reverse_pred=True)
        nl.store(out[1], d)
        return out

    for dt in (torch.float32, torch.bfloat16):
        x, y = _randn(32, 48, seed=56, dtype=dt), _randn(32, 48, seed=57, dtype=dt)
        ref, out = both(k, lambda: (x.to(dev), y.to(dev)), monkeypatch)
        _same(out, ref)
        _same(out[0], torch.where(x > 0, x, y))
        _same(out[1], x)
        nki.reset_compile_cache()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nl_softmax_rms_norm_replay(monkeypatch, dtype):
    """nl.softmax and nl.rms_norm: lowered to the interpreter's fp32 steps (fused into one group each)."""
    dev = _dev()

    @nki.jit
    def k(x, w):
        P, F = x.shape
        out = nl.ndarray((2, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out[0], nl.softmax(t, axis=1))
        wt = nl.load(w.reshape((1, F)))
        nl.store(out[1], nl.rms_norm(t, wt, axis=1, n=F))
        return out

    x, w = _randn(96, 200, seed=58, dtype=dtype), _randn(200, seed=59, dtype=dtype)
    ref, out = both(k, lambda: (x.to(dev), w.to(dev)), monkeypatch)
    assert nki.compile_stats()["fused_groups"] > 0
    # exp and the row sums: vector polynomial and SIMD order vs numpy; bf16: one rounding may flip
    tol = dict(rtol=4e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out.float(), ref.float(), **tol)
    xf, wf = x.float(), w.float()
    torch.testing.assert_close(out[0].float(), torch.softmax(xf, -1), rtol=2e-2, atol=1e-5)
    torch.testing.assert_close(out[1].float(), torch.nn.functional.rms_norm(xf, (200,), wf, 1e-6), rtol=2e-2,
                               atol=2e-2)


# ----------------------------------------------------------------------------------------------- integers, masks
_INT_TILE_OPS = ("add", "subtract", "multiply", "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor",
                 "left_shift", "right_shift", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
                 "logical_and", "logical_xor")


@nki.jit
def int_tile_math(x, y):
    """Every integer tile op of the tile API on two integer tiles, scalars of each Python kind (a Python int is an
    int64 operand to numpy, a Python float makes the op fp32, rounded and saturated on the store), unary ops."""
    P, F = x.shape
    n = len(_INT_TILE_OPS)
    out = nl.ndarray((n + 9, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.load(x)
    b = nl.load(y)
    for k, name in enumerate(_INT_TILE_OPS):
        nl.store(out[k], getattr(nl, name)(a, b))
    nl.store(out[n], a + 3)
    nl.store(out[n + 1], 7 - a)
    nl.store(out[n + 2], a * 2.5)
    nl.store(out[n + 3], nl.negative(a))
    nl.store(out[n + 4], nl.abs(a))
    nl.store(out[n + 5], nl.maximum(a, -5))
    nl.store(out[n + 6], nl.less(a, 2.5))
    nl.store(out[n + 7], (a & 0x0F) ^ b)
    c = nl.add(a, b, dtype=nl.int32)  # computed in the operands' dtype (wrapped there), then widened
    nl.store(out[n + 8], nl.subtract(c, b, dtype=x.dtype))
    return out


def _int_data(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -2 ** 31), min(info.max, 2 ** 31 - 1)
    x = torch.randint(lo, hi, shape, generator=g, dtype=torch.int64)
    edges = torch.tensor([info.min, info.max, 0, 1, -1 if info.min < 0 else 2, 7, 8, 9, 31, 32, 33])
    x.view(-1)[:edges.numel()] = edges.clamp(info.min, info.max)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8])
@pytest.mark.parametrize("shape", [(7, 33), (128, 65)])
def test_int_tile_math_replays(monkeypatch, dtype, shape):
    """Integer tiles replay in C (NKX_INT) with the interpreter's numpy rules: wrap-around in numpy's result
    dtype, shifts past the width, compares exact, float scalars computed in fp32 and saturated: bitwise equal."""
    dev = _dev()
    x, y = _int_data(shape, dtype, 60), _int_data(shape, dtype, 61)
    ref, out = both(int_tile_math, lambda: (x.to(dev), y.to(dev)), monkeypatch)
    _same(out, ref)
    n = len(_INT_TILE_OPS)
    info = torch.iinfo(dtype)
    bits = info.bits
    wrap = lambda v: (((v - info.min) % (1 << bits)) + info.min).to(dtype)  # noqa: E731
    xi, yi = x.to(torch.int64), y.to(torch.int64)
    _same(out[0], wrap(xi + yi))
    _same(out[2], wrap(xi * yi))
    _same(out[n], wrap(xi + 3))
    _same(out[n + 1], wrap(7 - xi))
    if bits <= 16:  # x * 2.5 is exact in fp32 there: rounded half to even, saturated
        _same(out[n + 2], (xi.double() * 2.5).round().clamp(info.min, info.max).to(dtype))
    assert st_ok(nki.compile_stats())


def st_ok(st):
    return st["fallbacks"] == [] and st["compiled_calls"] >= 1


@nki.jit
def int_casts(x, f):
    """Float -> int (round to nearest even, saturate, NaN 0), int -> float, int -> bool, through loads with
    dtype=, tensor_copy, stores, and nisa integer arithmetic (tensor_tensor, tensor_scalar with a tile vector and
    with a Python float, scalar_tensor_tensor)."""
    P, F = x.shape
    o_i = nl.ndarray((4, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    o_f = nl.ndarray((2, P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    o_b = nl.ndarray((P, F), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_q = nl.ndarray((P, F), dtype=nl.bool_, buffer=nl.shared_hbm)
    o_8 = nl.ndarray((P, F), dtype=nl.int8, buffer=nl.shared_hbm)
    ti = nl.load(f, dtype=x.dtype)  # float -> int on the load
    nl.store(o_i[0], ti)
    a = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    ff = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ff, src=a)  # int -> float
    nl.store(o_f[0], ff)
    nl.store(o_b, a)  # int -> bf16 on the store
    nl.store(o_q, a)  # int -> bool
    t8 = nl.ndarray((P, F), dtype=nl.int8, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t8, src=a)  # int -> int8 wraps
    nl.store(o_8, t8)
    s = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=s, data1=a, data2=ti, op=nl.subtract)
    nl.store(o_i[1], s)
    col = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=col, src=x[:, 0:1])
    v = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=v, data=a, op0=nl.multiply, operand0=col, op1=nl.bitwise_xor, operand1=5)
    nl.store(o_i[2], v)
    w = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=w, data=a, op0=nl.multiply, operand0=0.75, op1=nl.add, operand1=3)
    nl.store(o_i[3], w)
    g = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=g, data=a, op0=nl.right_shift, operand0=1, op1=nl.greater, operand1=ti)
    nl.store(o_f[1], g)
    return o_i, o_f, o_b, o_q, o_8


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
@pytest.mark.parametrize("shape", [(5, 19), (128, 40)])
def test_int_casts_saturation_replay(monkeypatch, dtype, shape):
    dev = _dev()
    x = _int_data(shape, dtype, 62)
    g = torch.Generator().manual_seed(63)
    f = torch.randn(shape, generator=g) * 3e4
    edges = torch.tensor([2.5, 3.5, -2.5, -0.5, 0.5, 1e10, -1e10, float("inf"), float("-inf"), float("nan"),
                          2147483520.0, 2147483648.0, -2147483904.0, 255.5, 256.0, -1.0, 127.5, -128.5, 32767.5,
                          65535.4, 16777217.0])
    f.view(-1)[:edges.numel()] = edges
    ref, out = both(int_casts, lambda: (x.to(dev), f.to(dev)), monkeypatch)
    _same(out, ref)
    info = torch.iinfo(dtype)
    expect = torch.nan_to_num(f.double(), nan=0.0).round().clamp(info.min, info.max).to(dtype)
    _same(out[0][0], expect)  # rounded to nearest even and saturated, also at int32's top (2^31 - 1)
    _same(out[1][0], x.float())
    _same(out[3], x != 0)
    assert st_ok(nki.compile_stats())


def test_float_to_int_saturates_at_int32_edges():
    """The interpreter's reference encoding: fp32 has no 2^31 - 1, so the clip runs in float64 (it once gave
    -2^31 for fp32 values >= 2^31 and 0 for uint32 values >= 2^32)."""
    from nki import _core

    v = np.array([3e9, 2147483648.0, -3e9, np.inf, -np.inf, np.nan, 2.5], np.float32)
    assert _core.int32.encode(v).tolist() == [2 ** 31 - 1, 2 ** 31 - 1, -2 ** 31, 2 ** 31 - 1, -2 ** 31, 0, 2]
    assert _core.uint32.encode(v).tolist() == [3000000000, 2 ** 31, 0, 2 ** 32 - 1, 0, 0, 2]
    assert _core.uint32.encode(np.array([5e9], np.float32)).tolist() == [2 ** 32 - 1]
    assert _core.int64.encode(np.array([1e19, -1e19], np.float32)).tolist() == [2 ** 63 - 1, -2 ** 63]


@nki.jit
def tri_masks(x):
    """Masks that are no box of the tile: a triangle (store, compute, fill), an affine predicate, a masked load
    whose index array leaves the tensor where the mask is false, a masked nisa instruction and reduce."""
    P, F = x.shape
    out = nl.ndarray((6, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    i = nl.mgrid[0:P, 0:F]
    for k in range(6):
        nl.store(out[k], 0.0)
    t = nl.load(x)
    nl.store(out[0, i.p, i.x], value=t, mask=(i.x <= i.p))
    u = nl.multiply(t, 2.0, mask=(i.p >= i.x))  # the rest of u keeps its NaN fill
    nl.store(out[1], u)
    nl.store(out[2, i.p, i.x], value=-1.0, mask=(i.p * 2 + i.x < 40) & (i.x % 3 != 1))
    v = nl.load(x[i.p + 3, i.x], mask=(i.p + 3 < P) & (i.x >= i.p))  # rows past P only where masked off
    nl.store(out[3], v)
    w = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=w, value=0.5)
    nisa.tensor_scalar(dst=w, data=t, op0=nl.add, operand0=1.0, mask=(i.x > i.p))
    nl.store(out[4], w)
    r = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=r, value=9.0)
    j = nl.mgrid[0:P, 0:1]
    nisa.tensor_reduce(dst=r, op=nl.add, data=t, axis=1, keepdims=True, mask=(j.p % 2 == 0))
    nl.store(out[5, :, 0:1], r)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 8), (37, 21), (128, 130)])
def test_mask_not_a_box_replays(monkeypatch, dtype, shape):
    """Masks of index expressions that are no box (a triangle, an affine predicate) replay in C: the result is
    computed whole, and NKX_COPY_IF writes the elements the mask keeps, with the mask as a constant tile."""
    dev = _dev()
    x = _randn(*shape, seed=64, dtype=dtype)
    ref, out = both(tri_masks, lambda: (x.to(dev),), monkeypatch)
    _same(out[:5], ref[:5])
    torch.testing.assert_close(out[5], ref[5], rtol=2e-6 if dtype == torch.float32 else 1e-2, atol=1e-6)
    _same(out[0], torch.tril(x) if shape[0] == shape[1] else out[0])
    assert torch.isnan(out[1]).sum() == (torch.triu(torch.ones(shape), 1) != 0).sum()


@nki.jit
def int_masked(x):
    P, F = x.shape
    out = nl.ndarray((2, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    i = nl.mgrid[0:P, 0:F]
    a = nl.load(x)
    nl.store(out[0], 1)
    nl.store(out[0, i.p, i.x], value=nl.add(a, 100, mask=(i.x < i.p + 2)), mask=(i.x < i.p + 2))
    nl.store(out[1], nl.left_shift(a, 3, mask=(i.x >= i.p)))  # the rest keeps the integer fill (4)
    return out


def test_int_masked_replays(monkeypatch):
    dev = _dev()
    x = _int_data((19, 23), torch.int16, 65)
    ref, out = both(int_masked, lambda: (x.to(dev),), monkeypatch)
    _same(out, ref)
    assert st_ok(nki.compile_stats())


@nki.jit
def int_float_math(x, y, col):
    """Integer ops numpy computes in a float dtype (float64 for int32 / int32, float16 for sqrt of int8, float32
    for an int8 tile and an fp32 scalar): the tile API, in-place /=, tensor_tensor and tensor_scalar, stored to
    fp32, fp16, bf16 and the integer dtype (rounded to nearest even, saturated, NaN and int / 0 encoded)."""
    P, F = x.shape
    o_f = nl.ndarray((12, P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    o_i = nl.ndarray((6, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    o_h = nl.ndarray((4, P, F), dtype=nl.float16, buffer=nl.shared_hbm)
    o_b = nl.ndarray((3, P, F), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    a = nl.load(x)
    b = nl.load(y)
    c = nl.load(col)
    nl.store(o_f[0], nl.divide(a, b, dtype=nl.float32))
    nl.store(o_f[1], nl.divide(a, 3, dtype=nl.float32))
    nl.store(o_f[2], nl.divide(7, a, dtype=nl.float32))
    nl.store(o_f[3], nl.divide(a, 2.5, dtype=nl.float32))
    nl.store(o_f[4], nl.divide(a, 0, dtype=nl.float32))
    nl.store(o_f[5], nl.sqrt(a, dtype=nl.float32))
    nl.store(o_f[6], nl.rsqrt(a, dtype=nl.float32))
    nl.store(o_f[7], nl.reciprocal(a, dtype=nl.float32))
    nl.store(o_f[8], nl.divide(a, 0.1, dtype=nl.float32))
    f = nl.load(x, dtype=nl.float32)
    nl.store(o_f[9], nl.divide(f, b, dtype=nl.float32))  # fp32 tile / integer tile
    nl.store(o_f[10], nl.divide(a, c, dtype=nl.float32))  # a [P, 1] integer column broadcast along the free axis
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=t, data1=a, data2=b, op=nl.divide)
    nl.store(o_f[11], t)
    nl.store(o_i[0], a / b)  # float quotient rounded into the integer tile
    nl.store(o_i[1], 100 / a)
    nl.store(o_i[2], nl.sqrt(a))
    u = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=u, data=a, op0=nl.divide, operand0=c)
    nl.store(o_i[3], u)
    w = nl.load(x)
    w /= b
    nl.store(o_i[4], w)
    v = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=v, data=a, op0=nl.divide, operand0=4, reverse0=True)
    nl.store(o_i[5], v)
    nl.store(o_h[0], nl.divide(a, b, dtype=nl.float16))  # float64 -> fp16 rounded once
    nl.store(o_h[1], nl.sqrt(a, dtype=nl.float16))
    nl.store(o_h[2], nl.divide(a, 3, dtype=nl.float16))
    nl.store(o_h[3], nl.reciprocal(b, dtype=nl.float16))
    nl.store(o_b[0], nl.divide(a, b, dtype=nl.bfloat16))
    nl.store(o_b[1], nl.rsqrt(a, dtype=nl.bfloat16))
    nl.store(o_b[2], nl.divide(a, 7, dtype=nl.bfloat16))
    return o_f, o_i, o_h, o_b


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(7, 33), (128, 65)])
def test_int_divide_sqrt_replays(monkeypatch, dtype, shape):
    """divide, sqrt, rsqrt and reciprocal of integer tiles replay in C in numpy's float result dtype, every
    operation correctly rounded there, so bitwise the interpreter's; x / 0 is inf or nan in the float dtype, then
    the store's encoding (0 for NaN into an integer, saturation for inf)."""
    dev = _dev()
    x, y = _int_data(shape, dtype, 70), _int_data(shape, dtype, 71)
    if dtype == torch.int64:  # quotients of values past 2^53: float64 rounds each operand first, as numpy
        x.view(-1)[-4:] = torch.tensor([2 ** 62 + 1, -(2 ** 62) - 3, 2 ** 53 + 1, -(2 ** 63)])
    col = y[:, 0:1].clone()
    ref, out = both(int_float_math, lambda: (x.to(dev), y.to(dev), col.to(dev)), monkeypatch)
    _same(out, ref)
    xd, yd = x.double(), y.double()
    _same(out[0][0], (xd / yd).float())
    _same(out[0][4], (xd / 0).float())
    assert st_ok(nki.compile_stats())


@nki.jit
def int_reductions(x, x3, means):
    """Integer reductions over the free axes: nl.sum (numpy sums small integers in int64), nl.max, nl.min,
    nl.mean (float64), tensor_reduce (np.add.reduce keeps the input dtype: it wraps there) with negate, into
    integer, fp32 and bf16 tiles, keepdims and a [P, A, B] tile reduced over one and both free axes."""
    P, F = x.shape
    o_i = nl.ndarray((P, 8), dtype=x.dtype, buffer=nl.shared_hbm)
    o_w = nl.ndarray((P, 2), dtype=nl.int32, buffer=nl.shared_hbm)
    o_f = nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    o_b = nl.ndarray((P, 1), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_3 = nl.ndarray((P, 3), dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.load(x)
    nl.store(o_i[:, 0:1], nl.sum(a, axis=1, keepdims=True))
    nl.store(o_i[:, 1], nl.max(a, axis=1))
    nl.store(o_i[:, 2], nl.min(a, axis=[1]))
    nl.store(o_i[:, 3], nl.mean(a, axis=1) if means else nl.min(a, axis=1))
    r = nl.ndarray((P, 4), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r[:, 0:1], op=nl.add, data=a, axis=1, keepdims=True)
    nisa.tensor_reduce(dst=r[:, 1:2], op=nl.maximum, data=a, axis=1, negate=True, keepdims=True)
    nisa.tensor_reduce(dst=r[:, 2:3], op=nl.minimum, data=a, axis=1, keepdims=True)
    nisa.tensor_reduce(dst=r[:, 3:4], op=nl.add, data=a, axis=1, negate=True, keepdims=True)
    nl.store(o_i[:, 4:8], r)
    w = nl.ndarray((P, 2), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=w[:, 0:1], op=nl.add, data=a, axis=1, keepdims=True)  # wrapped in x's dtype, widened
    nl.store(w[:, 1:2], nl.sum(a, axis=1, keepdims=True, dtype=nl.int32))
    nl.store(o_w, w)
    nl.store(o_f[:, 0], nl.sum(a, axis=1, dtype=nl.float32))
    nl.store(o_f[:, 1], nl.mean(a, axis=1, dtype=nl.float32) if means else nl.sum(a, axis=1, dtype=nl.float32))
    nl.store(o_f[:, 2], nl.max(a, axis=1, dtype=nl.float32))
    t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=t, op=nl.add, data=a, axis=1, keepdims=True)
    nl.store(o_f[:, 3:4], t)
    nl.store(o_b, nl.sum(a, axis=1, keepdims=True, dtype=nl.bfloat16))
    a3 = nl.load(x3)
    nl.store(o_3[:, 0], nl.sum(a3, axis=[1, 2]))
    m = nl.max(a3, axis=1)
    nl.store(o_3[:, 1], nl.min(m, axis=1))
    nl.store(o_3[:, 2], nl.mean(a3, axis=(1, 2)) if means else nl.max(a3, axis=(1, 2)))
    return o_i, o_w, o_f, o_b, o_3


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(7, 33), (128, 65)])
def test_int_reductions_replay(monkeypatch, dtype, shape):
    """Integer reductions replay in C (NKX_I_RSUM/RMAX/RMIN/RMEAN) with numpy's result dtype: bitwise."""
    dev = _dev()
    x = _int_data(shape, dtype, 72)
    if dtype == torch.int64:
        x.view(-1)[-3:] = torch.tensor([2 ** 62, 2 ** 62, -(2 ** 63)])  # the int64 sum wraps
    x3 = x[:, :shape[1] // 3 * 3].reshape(shape[0], shape[1] // 3, 3).contiguous()
    ref, out = both(int_reductions, lambda: (x.to(dev), x3.to(dev), True), monkeypatch)
    _same(out, ref)  # an int64 mean too: its float64 sum in numpy's pairwise order
    assert st_ok(nki.compile_stats())
    xi = x.to(torch.int64)
    if dtype != torch.int64:
        _same(out[0][:, 1], x.max(dim=1).values)
        _same(out[2][:, 0], xi.sum(dim=1).float())


@nki.jit
def int_select(x, y):
    """select / nl.where / affine_select with integer tiles: numpy's where result dtype (an int8 tile and an
    fp32 scalar give fp32, an int32 tile and a Python float float64), then the store's encoding (wrap, or round
    and saturate from a float), into integer, fp32 and bf16 tiles; predicates of each kind."""
    P, F = x.shape
    o_i = nl.ndarray((8, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    o_f = nl.ndarray((3, P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    o_b = nl.ndarray((P, F), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_8 = nl.ndarray((P, F), dtype=nl.int8, buffer=nl.shared_hbm)
    a = nl.load(x)
    b = nl.load(y)
    p = nl.greater(a, b)  # an fp32 0/1 tile
    q = nl.bitwise_and(a, 4)  # an integer predicate tile
    s = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.select(dst=s, predicate=p, on_true=a, on_false=b)
    nl.store(o_i[0], s)
    nl.store(o_i[1], nl.where(q, a, 5))
    nl.store(o_i[2], nl.where(p, a, 2.5))  # 2.5 rounds to 2 in the integer tile
    nl.store(o_i[3], nl.where(q, -3, b))
    c = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.affine_select(dst=c, pattern=[[-1, F]], channel_multiplier=1, on_true_tile=a, on_false_value=-7.0,
                       cmp_op=nl.greater_equal)
    nl.store(o_i[4], c)
    i = nl.mgrid[0:P, 0:F]
    nl.store(o_i[5], nisa.affine_select(i.p - i.x >= 0, a, -9984.0))  # saturates in a narrow integer tile
    nl.store(o_i[6], nl.where(i.x % 3 == 0, b, a))  # an index-expression predicate
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=a)
    nisa.select(dst=t, predicate=q, on_true=b, on_false=t)  # in place: the false side is the destination
    nl.store(o_i[7], t)
    nl.store(o_f[0], nl.where(p, a, b, dtype=nl.float32))
    nl.store(o_f[1], nl.where(q, a, -1.5, dtype=nl.float32))
    f = nl.load(y, dtype=nl.float32)
    nl.store(o_f[2], nl.where(p, a, f, dtype=nl.float32))  # an integer and a float tile
    nl.store(o_b, nl.where(p, a, b, dtype=nl.bfloat16))
    e = nl.ndarray((P, F), dtype=nl.int8, buffer=nl.sbuf)
    nisa.select(dst=e, predicate=p, on_true=a, on_false=300)  # wraps into int8
    nl.store(o_8, e)
    return o_i, o_f, o_b, o_8


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(7, 33), (128, 65)])
def test_int_select_replays(monkeypatch, dtype, shape):
    dev = _dev()
    x, y = _int_data(shape, dtype, 73), _int_data(shape, dtype, 74)
    ref, out = both(int_select, lambda: (x.to(dev), y.to(dev)), monkeypatch)
    _same(out, ref)
    _same(out[0][0], torch.maximum(x, y))
    assert st_ok(nki.compile_stats())


@nki.jit
def masked_reduce_matmul(x, y):
    """A mask on nl reductions, nl.matmul and nl.load_transpose2d: the interpreter computes and writes every
    element of the new tile (it applies no mask there), and the replay does the same."""
    P, F = x.shape
    _, N = y.shape
    o_r = nl.ndarray((P, 4), dtype=x.dtype, buffer=nl.shared_hbm)
    o_m = nl.ndarray((F, N), dtype=nl.float32, buffer=nl.shared_hbm)
    o_t = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.shared_hbm)
    i = nl.mgrid[0:P, 0:F]
    a = nl.load(x)
    b = nl.load(y)
    nl.store(o_r[:, 0:1], nl.max(a, axis=1, keepdims=True, mask=(i.p < P - 1)))
    nl.store(o_r[:, 1], nl.min(a, axis=1, mask=(i.x >= i.p)))
    nl.store(o_r[:, 2], nl.sum(a, axis=1, mask=(i.x < 3)))  # small integer values: every order sums exactly
    nl.store(o_r[:, 3], nl.mean(a, axis=[1], mask=(i.p % 2 == 0)))
    j = nl.mgrid[0:F, 0:N]
    nl.store(o_m, nl.matmul(a, b, transpose_x=True, mask=(j.p < F - 2)))
    nl.store(o_t, nl.load_transpose2d(x, mask=(i.p < P - 1)))
    return o_r, o_m, o_t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 5, 9), (128, 96, 130)])
def test_masked_nl_reduce_matmul_transpose_replay(monkeypatch, dtype, shape):
    dev = _dev()
    P, F, N = shape
    g = torch.Generator().manual_seed(75)
    x = torch.randint(-8, 9, (P, F), generator=g).to(dtype)
    y = torch.randint(-8, 9, (P, N), generator=g).to(dtype)
    ref, out = both(masked_reduce_matmul, lambda: (x.to(dev), y.to(dev)), monkeypatch)
    _same(out, ref)
    _same(out[1], x.float().T @ y.float())
    _same(out[2], x.T)
    assert st_ok(nki.compile_stats())


def _plans():
    return [p for p in list(_compile._PLANS.values()) + list(_compile._FAST.values()) if isinstance(p, _compile.Plan)]


@pytest.mark.parametrize("name,rows", [("rmsnorm", 512), ("rmsnorm", 333), ("softmax", 640)])
def test_joined_groups(monkeypatch, name, rows):
    """Back-to-back fused groups that share no bytes (one per 128-row tile) run in one parallel
    region (NKX_JOIN_NEXT; NKI_JOIN=0 runs them one after another): bitwise equal, as every row is computed
    by the same loops either way."""
    dev = _dev()
    x = _randn(rows, 1024, seed=70)
    w = _randn(1024, seed=71)
    bench = _bench()
    kern, mk = (bench.rmsnorm_kernel, lambda: (x.to(dev), w.to(dev))) if name == "rmsnorm" else \
        (bench.softmax_kernel, lambda: (x.to(dev),))
    monkeypatch.setenv("NKI_JOIN", "0")
    _, apart = both(kern, mk, monkeypatch)
    assert all(p.joined == 0 for p in _plans())
    nki.reset_compile_cache()
    monkeypatch.setenv("NKI_JOIN", "1")
    ref, joined = both(kern, mk, monkeypatch)
    # every full tile joins (a tail tile's group follows its masked load, so it runs on its own)
    assert any(p.joined >= rows // 128 for p in _plans()), [(p.steps, p.fused, p.joined) for p in _plans()]
    _same(joined, apart)
    torch.testing.assert_close(joined, ref, rtol=1e-5, atol=1e-6)


@nki.jit
def _shift_rows(x):
    """Each program copies row block i + 1 of x into row block i of x, in place and in program order: program
    i reads the block program i + 1 then overwrites, so the copies must not merge into one."""
    i = nl.program_id(0)
    t = nl.load(x[(i + 1) * 32:(i + 2) * 32, :])
    nl.store(x[i * 32:(i + 1) * 32, :], value=t)
    return x


@nki.jit
def _rows_then_sum(x):
    """Per program: the row sums of a [32, 64] block; the programs' reduces merge along the rows."""
    out = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    t = nl.load(x[i * 32:(i + 1) * 32, :])
    nl.store(out[i * 32:(i + 1) * 32, :], value=nl.sum(t, axis=1, keepdims=True))
    return out


def test_merge_adjacent_steps_keeps_dependencies(monkeypatch):
    """Steps that repeat each other on adjacent blocks merge (_compile._merge) only when neither reads what the
    other writes: an in-place shift of row blocks (program i reads the block program i + 1 writes) keeps its
    steps and gives the interpreter's result; independent per-row reductions merge along the rows."""
    dev = _dev()
    x = _randn(4 * 32, 48, seed=61)
    ref, out = both(_shift_rows[3], lambda: (x.clone().to(dev),), monkeypatch)
    _same(out, ref)
    _same(out[:96], x[32:])
    (plan,) = [p for p in _compile._PLANS.values() if p is not _compile._INTERPRET]
    assert plan.steps == 3, plan.ins["kind"]
    nki.reset_compile_cache()
    x = _randn(4 * 32, 64, seed=62)
    ref, out = both(_rows_then_sum[4], lambda: (x.to(dev),), monkeypatch)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-5)
    (plan,) = [p for p in _compile._PLANS.values() if p is not _compile._INTERPRET]
    sizes = [r["o"][0]["sizes"][0] for r in plan.ins]
    assert max(sizes) == 128, (plan.ins["kind"], sizes)
    monkeypatch.setenv("NKI_MERGE", "0")
    nki.reset_compile_cache()
    _, unmerged = both(_rows_then_sum[4], lambda: (x.to(dev),), monkeypatch)
    _same(out, unmerged)  # the same library loops on the same rows: the same bits


@nki.jit
def _sumsq_rows(x):
    """Row sums and means of squares (a square whose only reader is the next sum: the fused executor folds the
    pair into one pass over x, nki_exec.c nkx_folds_find), and x scaled by the sum."""
    R, C = x.shape
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    stats = nl.ndarray((R, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    ss = nl.sum(nl.square(t), axis=1, keepdims=True)
    ms = nl.mean(nl.multiply(t, t), axis=1, keepdims=True)
    nl.store(out, value=nl.multiply(t, ss))
    nl.store(stats[:, 0:1], value=ss)
    nl.store(stats[:, 1:2], value=ms)
    return out, stats


@pytest.mark.parametrize("cols", [1000, 1003, 37, 4101])
def test_fused_sum_of_squares_folded(monkeypatch, cols):
    """The folded square + sum gives the bits of squaring into a tile and summing it (the unfused replay), for
    rows with a partial vector, a scalar tail and more than one cascade level."""
    dev = _dev()
    x = _randn(96, cols, seed=70 + cols)
    _compile.reset()
    monkeypatch.setenv("NKI_FUSE", "0")
    _, plain = both(_sumsq_rows, lambda: (x.to(dev),), monkeypatch)
    _compile.reset()
    monkeypatch.setenv("NKI_FUSE", "1")
    ref, fused = both(_sumsq_rows, lambda: (x.to(dev),), monkeypatch)
    assert nki.compile_stats()["fused_groups"] > 0
    _same(fused, plain)
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-4)


@nki.jit
def int_transcendentals(x, y):
    """Float math of integer tiles, in numpy's float result dtype (float16 for int8/uint8, float32 for int16,
    float64 for int32/int64; float32 or float64 with an fp32 scalar): the tile API, tensor_scalar and
    tensor_tensor, stored to fp32, fp16, bf16 and the integer dtype (rounded, saturated, NaN as 0)."""
    P, F = x.shape
    names = _INT_TRANSCENDENTALS
    o_f = nl.ndarray((len(names) + 8, P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    o_i = nl.ndarray((6, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    o_h = nl.ndarray((3, P, F), dtype=nl.float16, buffer=nl.shared_hbm)
    o_b = nl.ndarray((2, P, F), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    a = nl.load(x)
    b = nl.load(y)
    for k, name in enumerate(names):
        nl.store(o_f[k], getattr(nl, name)(a, dtype=nl.float32))
    n = len(names)
    nl.store(o_f[n], nl.power(a, 0.5, dtype=nl.float32))  # NaN for negative bases
    nl.store(o_f[n + 1], nl.power(a, 1.5, dtype=nl.float32))
    nl.store(o_f[n + 2], nl.power(2.0, nl.minimum(a, 20), dtype=nl.float32))
    nl.store(o_f[n + 3], nl.mod(a, 3.5, dtype=nl.float32))
    nl.store(o_f[n + 4], nl.fmod(a, -2.5, dtype=nl.float32))
    nl.store(o_f[n + 5], nl.mod(a, 0.0, dtype=nl.float32))  # NaN
    f = nl.load(y, dtype=nl.float32)
    nl.store(o_f[n + 6], nl.power(a, f * 0.25, dtype=nl.float32))  # an integer tile and an fp32 tile
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=t, data=a, op0=nl.mod, operand0=7.0, op1=nl.multiply, operand1=2.0)
    nl.store(o_f[n + 7], t)
    nl.store(o_i[0], nl.exp(a))  # saturates, into the integer tile
    nl.store(o_i[1], nl.log(a))  # NaN and -inf for x <= 0
    nl.store(o_i[2], nl.tanh(a))
    nl.store(o_i[3], nl.sin(a) * 100.0)
    nl.store(o_i[4], nl.sigmoid(a))
    u = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=u, data1=a, data2=f, op=nl.power)
    nl.store(o_i[5], u)
    nl.store(o_h[0], nl.exp(a, dtype=nl.float16))
    nl.store(o_h[1], nl.cos(a, dtype=nl.float16))
    nl.store(o_h[2], nl.power(a, 0.25, dtype=nl.float16))
    nl.store(o_b[0], nl.log(a, dtype=nl.bfloat16))
    nl.store(o_b[1], nl.arctan(a, dtype=nl.bfloat16))
    return o_f, o_i, o_h, o_b


_INT_TRANSCENDENTALS = ("exp", "log", "tanh", "sin", "cos", "tan", "arctan", "sqrt", "rsqrt", "sigmoid", "gelu",
                        "relu", "ceil", "floor", "trunc", "sign", "square")
_INT_EXACT = ("sqrt", "rsqrt", "relu", "ceil", "floor", "trunc", "sign", "square")


def _ulps_close(a, b, ulps):
    """a and b equal, or within ulps units in the last place of a's float dtype (NaN where the other is)."""
    if a.dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        return bool((a == b).all())
    eps = torch.finfo(a.dtype).eps
    ad, bd = a.double(), b.double()
    same = (ad == bd) | (ad.isnan() & bd.isnan())
    tol = ulps * eps * torch.maximum(ad.abs(), bd.abs()).clamp_min(torch.finfo(a.dtype).tiny)
    return bool((same | ((ad - bd).abs() <= tol)).all())


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(37, 45), (128, 65)])
def test_int_transcendentals_replay(monkeypatch, dtype, shape):
    """exp, log, tanh, sin, cos, tan, arctan, power with a float exponent, mod/fmod with a float operand,
    sigmoid/gelu (fp32 functions of the converted tile) of integer tiles replay in C: <math.h>'s functions in
    numpy's result dtype (double for float64, float for fp32 and fp16), within a few ulps of numpy's own loops
    (which are SIMD ones on some CPUs, not correctly rounded), exact where both are (mod, fmod, ceil, sign...)."""
    dev = _dev()
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -3000), min(info.max, 3000)
    g = torch.Generator().manual_seed(90)
    x = torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int64)
    x.view(-1)[:6] = torch.tensor([info.min, info.max, 0, 1, 2, 88]).clamp(info.min, info.max)
    y = torch.randint(max(info.min, -12), min(info.max, 12) + 1, shape, generator=g, dtype=torch.int64)
    x, y = x.to(dtype), y.to(dtype)
    ref, out = both(int_transcendentals, lambda: (x.to(dev), y.to(dev)), monkeypatch)
    n = len(_INT_TRANSCENDENTALS)
    for k, name in enumerate(_INT_TRANSCENDENTALS):
        if name in _INT_EXACT:
            _same(out[0][k], ref[0][k])
        else:
            assert _ulps_close(out[0][k], ref[0][k], 4), name
    for k in range(n, n + 8):
        if k in (n + 3, n + 4, n + 5, n + 7):  # mod and fmod: exact in every float dtype
            _same(out[0][k], ref[0][k])
        else:
            assert _ulps_close(out[0][k], ref[0][k], 4), k
    # The integer stores round a value a few ulps apart: equal unless it sits on a .5 boundary (none here),
    # or unless the value passes 2^53, where one float64 ulp is more than 1 (a 31^12 power: numpy's AVX-512
    # pow and <math.h>'s differ by one ulp, 32, on a Zen 4); there, within 4 float64 ulps.
    big = ref[1].double().abs() >= 2.0**53
    _same(out[1][~big], ref[1][~big])
    assert _ulps_close(out[1][big].double(), ref[1][big].double(), 4)
    assert _ulps_close(out[2], ref[2], 2) and _ulps_close(out[3], ref[3], 2)
    xd = x.double()
    if dtype in (torch.int32, torch.int64):  # float64 math, rounded once to fp32
        torch.testing.assert_close(out[0][0], torch.exp(xd).float(), rtol=1.2e-7, atol=0)
    _same(out[0][n + 3], torch.remainder(xd, 3.5).float())  # the divisor's sign
    _same(out[0][n + 4], torch.fmod(xd, -2.5).float())  # the dividend's sign
    assert st_ok(nki.compile_stats())


@nki.jit
def int_pow_mod(x, y, e):
    """Integer power (numpy's wrapping integer power), mod (the divisor's sign) and fmod (the dividend's sign)
    of two integer tiles, x % 0 = 0 as numpy gives; the tile API, tensor_tensor and a tiled loop whose last
    32-row tile is masked."""
    P, F = x.shape
    o = nl.ndarray((6, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    o32 = nl.ndarray((P, F), dtype=nl.int32, buffer=nl.shared_hbm)
    for r in nl.affine_range((P + 31) // 32):
        i_p = r * 32 + nl.arange(32)[:, None]
        i_f = nl.arange(F)[None, :]
        m = i_p < P
        a = nl.load(x[i_p, i_f], mask=m)
        b = nl.load(y[i_p, i_f], mask=m)
        c = nl.load(e[i_p, i_f], mask=m)
        nl.store(o[0, i_p, i_f], nl.mod(a, b, mask=m), mask=m)
        nl.store(o[1, i_p, i_f], nl.fmod(a, b, mask=m), mask=m)
        nl.store(o[2, i_p, i_f], nl.power(a, c, mask=m), mask=m)
        t = nl.ndarray((32, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=b, data2=a, op=nl.mod)
        nl.store(o[3, i_p, i_f], t, mask=m)
        nl.store(o[4, i_p, i_f], nl.square(a, mask=m), mask=m)
        nl.store(o[5, i_p, i_f], nl.sign(a, mask=m), mask=m)
        nl.store(o32[i_p, i_f], nl.power(b, c, dtype=nl.int32, mask=m), mask=m)
    return o, o32


def _np_int(t):
    return t.numpy()


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(37, 45), (64, 33)])
def test_int_pow_mod_replay(monkeypatch, dtype, shape):
    """Integer power, mod and fmod replay in C bitwise the interpreter's (numpy's integer loops: wrap, sign
    rules, 0 for a zero divisor and for x % -1)."""
    dev = _dev()
    x, y = _int_data(shape, dtype, 91), _int_data(shape, dtype, 92)
    y.view(-1)[::7] = 0  # zero divisors
    if info_signed(dtype):
        y.view(-1)[3::11] = -1
    g = torch.Generator().manual_seed(93)
    e = torch.randint(0, 70, shape, generator=g).to(dtype)
    with np.errstate(all="ignore"):
        ref, out = both(int_pow_mod, lambda: (x.to(dev), y.to(dev), e.to(dev)), monkeypatch)
    _same(out, ref)
    with np.errstate(all="ignore"):
        xn, yn, en = _np_int(x), _np_int(y), _np_int(e)
        assert (out[0][0].numpy() == np.mod(xn, yn)).all()
        assert (out[0][1].numpy() == np.fmod(xn, yn)).all()
        assert (out[0][2].numpy() == np.power(xn, en)).all()
    assert st_ok(nki.compile_stats())


def info_signed(dtype):
    return torch.iinfo(dtype).min < 0


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
def test_int_power_negative_exponent_raises(monkeypatch, dtype):
    """numpy refuses an integer to a negative integer power (ValueError), at run time: the replay raises the
    same error on the same values (checked before the step writes anything), never a different answer."""
    dev = _dev()
    shape = (37, 45)
    x = _int_data(shape, dtype, 94)
    e = torch.randint(0, 5, shape, generator=torch.Generator().manual_seed(95)).to(dtype)
    with np.errstate(all="ignore"):
        both(int_pow_mod, lambda: (x.to(dev), x.to(dev), e.to(dev)), monkeypatch)
    bad = e.clone()
    bad[36, 44] = -1  # in the masked tail tile
    for mode in ("0", "1"):
        monkeypatch.setenv("NKI_COMPILE", mode)
        traces = nki.compile_stats()["traces"]
        with pytest.raises(ValueError, match="Integers to negative integer powers are not allowed") as err:
            int_pow_mod(x.to(dev), x.to(dev), bad.to(dev))
        assert ("nki compiled kernel" in str(err.value)) == (mode == "1"), str(err.value)  # raised by the replay
        assert nki.compile_stats()["traces"] == traces
    st = nki.compile_stats()
    assert st["fallbacks"] == [], st


@nki.jit
def int64_means(x, x3):
    P, F = x.shape
    o = nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    o_i = nl.ndarray((P, 2), dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.load(x)
    nl.store(o[:, 0], nl.mean(a, axis=1, dtype=nl.float32))
    nl.store(o_i[:, 0], nl.mean(a, axis=1))
    r = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.mean, data=a, axis=1, keepdims=True,
                       negate=True)
    nl.store(o[:, 1:2], r)
    a3 = nl.load(x3)
    nl.store(o[:, 2], nl.mean(a3, axis=(1, 2), dtype=nl.float32))
    nl.store(o_i[:, 1], nl.mean(a3, axis=(1, 2)))
    nl.store(o[:, 3], nl.mean(a, axis=1, dtype=nl.float32))
    return o, o_i


@pytest.mark.parametrize("shape", [(37, 45), (128, 300)])
def test_int64_mean_replays(monkeypatch, shape):
    """An int64 mean: numpy sums the values as float64 in its pairwise order (8 accumulators, halves above 128),
    which the replay follows (NKX_I_PAIRWISE), so the rounded sum and the mean are bitwise the interpreter's."""
    dev = _dev()
    g = torch.Generator().manual_seed(96)
    x = torch.randint(-2 ** 62, 2 ** 62, shape, generator=g, dtype=torch.int64)
    x[:, ::3] = torch.randint(-100, 100, x[:, ::3].shape, generator=g)  # sums that round in float64
    x.view(-1)[:3] = torch.tensor([2 ** 63 - 1, -(2 ** 63), 2 ** 53 + 1])
    x3 = x[:, :shape[1] // 3 * 3].reshape(shape[0], shape[1] // 3, 3).contiguous()
    ref, out = both(int64_means, lambda: (x.to(dev), x3.to(dev)), monkeypatch)
    _same(out, ref)
    assert st_ok(nki.compile_stats())
    _same(out[0][:, 0], torch.from_numpy(np.mean(x.numpy(), axis=1)).float())


@nki.jit
def int_activations(x, bias):
    """nisa.activation / reciprocal / activation_reduce of integer tiles or into them: the interpreter reads the
    data as fp32 and runs its fp32 chain, then encodes into the destination (rounded, saturated)."""
    P, F = x.shape
    o_f = nl.ndarray((3, P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    o_i = nl.ndarray((2, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    o_r = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.load(x)
    bcol = nl.load(bias)
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=t, op=nl.tanh, data=a, scale=0.01, bias=bcol)
    nl.store(o_f[0], t)
    r = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=r, data=a)
    nl.store(o_f[1], r)
    u = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.activation(dst=u, op=nl.exp, data=a, scale=0.05)  # into the integer tile: rounded, saturated
    nl.store(o_i[0], u)
    f = nl.load(x, dtype=nl.float32)
    v = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.activation(dst=v, op=nl.sigmoid, data=f, scale=-0.5)  # float data into an integer tile
    nl.store(o_i[1], v)
    s = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    w = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=w, op=nl.sigmoid, data=a, reduce_op=nl.add, reduce_res=s)
    nl.store(o_f[2], w)
    nl.store(o_r, s)
    return o_f, o_i, o_r


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(37, 45), (128, 64)])
def test_int_activations_replay(monkeypatch, dtype, shape):
    """Activations of integer tiles replay as the float chain on the converted tile: the library's vector math,
    within a few ulps of numpy's fp32 loops (as for float tiles); the conversions and the store's encoding exact."""
    dev = _dev()
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(97)
    x = torch.randint(max(info.min, -300), min(info.max, 300) + 1, shape, generator=g, dtype=torch.int64).to(dtype)
    bias = torch.randn(shape[0], 1, generator=g)
    ref, out = both(int_activations, lambda: (x.to(dev), bias.to(dev)), monkeypatch)
    for k in range(3):
        assert _ulps_close(out[0][k], ref[0][k], 4), k
    # exp(x / 20) into the integer tile: the fp32 value may be an ulp from numpy's, and an fp32 ulp of up to 0.25
    # (values below 2^22) moves the rounded integer by at most 1
    torch.testing.assert_close(out[1][0], ref[1][0], rtol=0, atol=1)
    _same(out[1][1], ref[1][1])  # sigmoid into 0 or 1
    torch.testing.assert_close(out[2], ref[2], rtol=1e-5, atol=1e-5)  # a row sum of fp32 values, reordered
    assert st_ok(nki.compile_stats())
