"""The nki package: NKI kernels (written here in the style of the NKI docs' examples) against numpy/torch
references, the hardware limits, rounding on store, the neuron-device path and a Hub-layout kernel repo."""

import json
import os
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

import nki
import nki.isa as nisa
import nki.language as nl

HERE = os.path.abspath(__file__)


def _line(marker):
    """Line number of the one line of this file carrying ``marker`` (the kernel line an error must name)."""
    with open(HERE) as f:
        hits = [i + 1 for i, l in enumerate(f) if l.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def _expect_limit(exc, limit_words, value, marker):
    msg = str(exc.value)
    for w in limit_words:
        assert w in msg, msg
    assert re.search(rf"\b{value}\b", msg), msg
    assert f"test_nki.py:{_line(marker)}" in msg, msg


# ----------------------------------------------------------------------------------------------- kernels
@nki.jit
def add_grid(a, b):
    """Tensor add over an SPMD grid: each program adds one [128, 512] tile."""
    c = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i, j = nl.program_id(0), nl.program_id(1)
    rows = slice(i * 128, (i + 1) * 128)
    cols = slice(j * 512, (j + 1) * 512)
    ta = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a[rows, cols])
    nisa.dma_copy(dst=tb, src=b[rows, cols])
    tc = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=tc, data1=ta, data2=tb, op=nl.add)
    nisa.dma_copy(dst=c[rows, cols], src=tc)
    return c


@nki.jit(platform_target="trn2", mode="auto")
def matmul_tiled(lhsT, rhs):
    """result = lhsT.T @ rhs, tiled 128 x 128 x 512, partial sums accumulated in PSUM."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TM, TK, TN = nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.sequential_range(K // TK):
                a = nl.ndarray((nl.par_dim(TK), TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                nisa.dma_copy(dst=b, src=rhs[nl.ds(k * TK, TK), nl.ds(n * TN, TN)])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            out = nl.ndarray((TM, TN), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=out)
    return result


@nki.jit
def matmul_old_api(lhsT, rhs):
    """The older tile API: nl.load with index arrays, nl.matmul into a zeroed PSUM tile with +=."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    i_k = nl.arange(128)[:, None]
    i_m = nl.arange(M)[None, :]
    i_n = nl.arange(N)[None, :]
    res = nl.zeros((M, N), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // 128):
        a = nl.load(lhsT[k * 128 + i_k, i_m])
        b = nl.load(rhs[k * 128 + i_k, i_n])
        res += nl.matmul(a, b, transpose_x=True)
    i_o = nl.arange(M)[:, None]
    nl.store(result[i_o, i_n], value=nl.copy(res, dtype=result.dtype))
    return result


@nki.jit
def softmax_rows(x):
    """Row softmax with the tile API: max, exp(x - max), sum, divide."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    R, C = x.shape
    ix = nl.mgrid[0:128, 0:C]
    for r in nl.affine_range((R + 127) // 128):
        rows = r * 128 + ix.p
        t = nl.load(x[rows, ix.x], mask=(rows < R))
        mx = nl.max(t, axis=1, keepdims=True)
        e = nl.exp(nl.subtract(t, mx))
        s = nl.sum(e, axis=1, keepdims=True)
        nl.store(out[rows, ix.x], value=e / s, mask=(rows < R))
    return out


@nki.jit
def rmsnorm(x, w, eps):
    """RMSNorm of [N, D] rows (N <= 128 per tile) with nisa: activation(square) + reduce, rsqrt, scale."""
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    wt = nl.ndarray((1, D), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w.reshape((1, D)))
    for i in nl.affine_range((N + 127) // 128):
        p = min(128, N - i * 128)
        xt = nl.ndarray((128, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:p, :], src=x[i * 128:i * 128 + p, :])
        sq = nl.ndarray((128, D), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq[0:p], op=nl.square, data=xt[0:p], reduce_op=nl.add, reduce_res=ss[0:p],
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rs = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rs[0:p], data=ss[0:p], op0=nl.multiply, operand0=1.0 / D, op1=nl.add,
                           operand1=eps)
        nisa.activation(dst=rs[0:p], op=nl.rsqrt, data=rs[0:p])
        y = nl.ndarray((128, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y[0:p], data=xt[0:p], op0=nl.multiply, operand0=rs[0:p])
        nisa.tensor_tensor(dst=y[0:p], data1=y[0:p], data2=wt.broadcast(0, p), op=nl.multiply)
        nisa.dma_copy(dst=out[i * 128:i * 128 + p, :], src=y[0:p])
    return out


@nki.jit
def transpose_tiles(x):
    """[P, F] -> [F, P] by 128 x 128 blocks through nc_transpose (Tensor Engine, into PSUM)."""
    P, F = x.shape
    out = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(P // 128):
        for j in nl.affine_range(F // 128):
            t = nl.ndarray((128, 128), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128])
            tp = nl.ndarray((128, 128), dtype=x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp, data=t)
            o = nl.ndarray((128, 128), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o, src=tp)
            nisa.dma_copy(dst=out[j * 128:(j + 1) * 128, i * 128:(i + 1) * 128], src=o)
    return out


# ----------------------------------------------------------------------------------------------- numpy runs
def test_add_grid_numpy():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 1024), dtype=np.float32)
    b = rng.standard_normal((256, 1024), dtype=np.float32)
    np.testing.assert_array_equal(add_grid[2, 2](a, b), a + b)
    np.testing.assert_array_equal(nki.simulate(add_grid[2, 2])(a, b), a + b)


def test_program_id_and_num_programs():
    @nki.jit
    def ids(out):
        i = nl.program_id(0)
        t = nl.ndarray((1, 3), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t[:, 0:1], value=i)
        nisa.memset(dst=t[:, 1:2], value=nl.num_programs(0))
        nisa.memset(dst=t[:, 2:3], value=nl.program_ndim())
        nisa.dma_copy(dst=out[i:i + 1, :], src=t)
        return out

    out = np.zeros((3, 3), np.int32)
    ids[3](out)
    np.testing.assert_array_equal(out, [[0, 3, 1], [1, 3, 1], [2, 3, 1]])


@pytest.mark.parametrize("kernel", [matmul_tiled, matmul_old_api])
def test_matmul_numpy(kernel):
    rng = np.random.default_rng(1)
    lhsT = rng.standard_normal((256, 128), dtype=np.float32)
    rhs = rng.standard_normal((256, 1024 if kernel is matmul_tiled else 512), dtype=np.float32)
    np.testing.assert_allclose(kernel(lhsT, rhs), lhsT.T @ rhs, rtol=1e-4, atol=1e-4)


def test_softmax_masked_tail():
    x = np.random.default_rng(2).standard_normal((200, 64), dtype=np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(softmax_rows(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_rmsnorm():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((150, 96), dtype=np.float32)
    w = rng.standard_normal(96, dtype=np.float32)
    ref = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(rmsnorm(x, w, 1e-6), ref, rtol=1e-5, atol=1e-5)


def test_transpose():
    x = np.random.default_rng(4).standard_normal((256, 384), dtype=np.float32)
    np.testing.assert_array_equal(transpose_tiles(x), x.T)


def test_relu_older_api_bare_buffers():
    @nki.jit(platform_target="trn2")
    def relu(x):
        t = sbuf.view(dtype=x.dtype, shape=x.shape)  # noqa: F821 - resolved by nki.jit like the NKI compiler
        nisa.dma_copy(dst=t, src=x)
        o = sbuf.view(dtype=x.dtype, shape=x.shape)  # noqa: F821
        nisa.tensor_scalar(dst=o, data=t, op0=nl.maximum, operand0=0)
        res = hbm.view(dtype=x.dtype, shape=x.shape)  # noqa: F821
        nisa.dma_copy(dst=res, src=o)
        return res

    x = np.random.default_rng(5).standard_normal((64, 70), dtype=np.float32)
    np.testing.assert_array_equal(relu(x), np.maximum(x, 0))


def test_instructions_misc():
    @nki.jit
    def k(x, out_iota, out_sel, out_red, out_sel2):
        t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        io = nl.ndarray((128, 16), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=io, pattern=[[1, 16]], offset=3, channel_multiplier=100)
        nisa.dma_copy(dst=out_iota, src=io)
        # causal mask: keep column j <= row p  (p - j >= 0)
        cm = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=cm, pattern=[[-1, 128]], channel_multiplier=1, on_true_tile=t,
                           on_false_value=-9984.0, cmp_op=nl.greater_equal)
        nisa.dma_copy(dst=out_sel, src=cm)
        r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.maximum, data=t, axis=1, negate=True, keepdims=True)
        nisa.dma_copy(dst=out_red, src=r)
        pos = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=pos, data=t, op0=nl.greater, operand0=0.0)
        s = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        zero = nl.zeros((128, 128), dtype=nl.float32)
        nisa.select(dst=s, predicate=pos, on_true=t, on_false=zero)
        nisa.dma_copy(dst=out_sel2, src=s)

    x = np.random.default_rng(6).standard_normal((128, 128), dtype=np.float32)
    oi, os_, orr, os2 = (np.zeros((128, 16), np.int32), np.zeros((128, 128), np.float32),
                         np.zeros((128, 1), np.float32), np.zeros((128, 128), np.float32))
    k(x, oi, os_, orr, os2)
    np.testing.assert_array_equal(oi, 3 + 100 * np.arange(128)[:, None] + np.arange(16)[None, :])
    np.testing.assert_array_equal(os_, np.where(np.tril(np.ones((128, 128), bool)), x, np.float32(-9984.0)))
    np.testing.assert_array_equal(orr, -x.max(axis=1, keepdims=True))
    np.testing.assert_array_equal(os2, np.where(x > 0, x, 0))


def test_access_pattern_and_views():
    @nki.jit
    def k(x):
        out = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 16), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        o = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=t.ap([[16, 4], [2, 8]], offset=1))  # odd columns
        nisa.dma_copy(dst=out, src=o)
        return out

    x = np.arange(64, dtype=np.float32).reshape(4, 16)
    np.testing.assert_array_equal(k(x), x[:, 1::2])


# ----------------------------------------------------------------------------------------------- PSUM semantics
def test_nc_matmul_first_write_overwrites_then_accumulates():
    @nki.jit
    def k(a, b, out):
        ta = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.sbuf)
        tb = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ta, src=a)
        nisa.dma_copy(dst=tb, src=b)
        ps = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.psum)  # NaN-filled: an accumulate would show
        nisa.nc_matmul(dst=ps, stationary=ta, moving=tb)
        nisa.nc_matmul(dst=ps, stationary=ta, moving=tb)
        o = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=ps)  # evacuating ends the accumulation group
        nisa.dma_copy(dst=out[0], src=o)
        nisa.nc_matmul(dst=ps, stationary=ta, moving=tb)  # overwrites again
        nisa.nc_matmul(dst=ps, stationary=ta, moving=tb, accumulate=True)
        nisa.nc_matmul(dst=ps, stationary=ta, moving=tb, accumulate=True)
        nisa.tensor_copy(dst=o, src=ps)
        nisa.dma_copy(dst=out[1], src=o)
        nisa.nc_matmul(dst=ps, stationary=ta, moving=tb, accumulate=False)
        nisa.tensor_copy(dst=o, src=ps)
        nisa.dma_copy(dst=out[2], src=o)

    rng = np.random.default_rng(7)
    a = rng.integers(-3, 4, (128, 32)).astype(np.float32)
    b = rng.integers(-3, 4, (128, 64)).astype(np.float32)
    out = np.zeros((3, 32, 64), np.float32)
    k(a, b, out)
    ref = a.T @ b
    np.testing.assert_array_equal(out[0], 2 * ref)
    np.testing.assert_array_equal(out[1], 3 * ref)
    np.testing.assert_array_equal(out[2], ref)


def test_fresh_allocations_are_nan():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=out, src=t)  # never written
        return out

    assert np.isnan(k(np.zeros((4, 4), np.float32))).all()


# ----------------------------------------------------------------------------------------------- rounding
def _bf16_round(x):
    import torch

    return torch.from_numpy(x).to(torch.bfloat16).float().numpy()


@nki.jit
def roundtrip(x, dt):
    """fp32 -> a tile of dtype dt (rounded on store) -> fp32."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_bf16_and_fp16_rounding_on_store():
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((64, 257)) * 10 ** rng.uniform(-8, 8, (64, 257))).astype(np.float32)
    x[0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    x[1, :3] = [1.00390625, 1.01171875, 3.3895314e38]  # ties to even, bf16 overflow to inf
    x[2, :2] = [70000.0, -1e-8]  # fp16 overflow to inf, underflow
    np.testing.assert_array_equal(roundtrip(x, nl.bfloat16), _bf16_round(x))
    with np.errstate(over="ignore"):
        ref16 = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(roundtrip(x, nl.float16), ref16)


def test_compute_result_rounded_to_dst_dtype():
    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        ta = nl.load(a)
        tb = nl.load(b)
        s = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=ta, data2=tb, op=nl.multiply)  # fp32 math, bf16 store
        nl.store(out, s)
        return out

    rng = np.random.default_rng(9)
    a = rng.standard_normal((32, 40), dtype=np.float32)
    b = rng.standard_normal((32, 40), dtype=np.float32)
    np.testing.assert_array_equal(k(a, b), _bf16_round(a * b))


# ----------------------------------------------------------------------------------------------- limits
def test_partition_limit():
    @nki.jit
    def k(x):
        t = nl.ndarray((129, 4), dtype=nl.float32, buffer=nl.sbuf)  # LIMIT-PARTITION
        return x

    with pytest.raises(nki.NkiError) as e:
        k(np.zeros((1, 1), np.float32))
    _expect_limit(e, ["partition dimension"], 129, "LIMIT-PARTITION")


def test_partition_limit_on_load():
    @nki.jit
    def k(x):
        t = nl.load(x)  # LIMIT-LOAD
        return x

    with pytest.raises(nki.NkiError) as e:
        k(np.zeros((256, 4), np.float32))
    _expect_limit(e, ["partition dimension"], 256, "LIMIT-LOAD")


@pytest.mark.parametrize("target,cap", [("trn2", 224 * 1024), ("trn1", 192 * 1024)])
def test_sbuf_capacity(target, cap):
    def fits(x):  # 4 x 48 KiB = 192 KiB per partition: fits trn1 and trn2
        keep = [nl.ndarray((128, 12 * 1024), dtype=nl.float32, buffer=nl.sbuf) for _ in range(4)]
        return x

    def over(x):
        keep = [nl.ndarray((128, 12 * 1024), dtype=nl.float32, buffer=nl.sbuf) for _ in range(4)]
        extra = nl.ndarray((128, 8 * 1024), dtype=nl.float32, buffer=nl.sbuf)  # LIMIT-SBUF
        return x

    nki.jit(fits, platform_target=target)(np.zeros(1, np.float32))
    if target == "trn2":  # 224 KiB: 192 + 32 fits exactly
        nki.jit(over, platform_target=target)(np.zeros(1, np.float32))
        return
    with pytest.raises(nki.NkiError) as e:
        nki.jit(over, platform_target=target)(np.zeros(1, np.float32))
    _expect_limit(e, ["SBUF capacity per partition", target], 224 * 1024, "LIMIT-SBUF")
    assert str(cap) in str(e.value)


def test_sbuf_capacity_target_from_environment(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")

    @nki.jit
    def k(x):
        t = nl.ndarray((128, 200 * 256), dtype=nl.float32, buffer=nl.sbuf)  # 200 KiB
        return x

    with pytest.raises(nki.NkiError, match="trn1"):
        k(np.zeros(1, np.float32))
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE")
    k(np.zeros(1, np.float32))


def test_sbuf_freed_tiles_are_reused():
    @nki.jit
    def k(x):
        for i in nl.affine_range(50):  # 50 x 96 KiB tiles over the loop, at most two alive at a time
            t = nl.ndarray((128, 24 * 1024), dtype=nl.float32, buffer=nl.sbuf)
        return x

    k(np.zeros(1, np.float32))


def test_psum_capacity():
    @nki.jit
    def k(x):
        banks = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
        more = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum)  # LIMIT-PSUM
        return x

    with pytest.raises(nki.NkiError) as e:
        k(np.zeros(1, np.float32))
    _expect_limit(e, ["PSUM capacity", "8 banks x 2 KiB"], 16388, "LIMIT-PSUM")


@pytest.mark.parametrize("m,n,words,value", [
    (129, 64, ["nc_matmul stationary free dimension"], 129),
    (64, 513, ["nc_matmul moving free dimension"], 513),
])
def test_nc_matmul_limits(m, n, words, value):
    @nki.jit
    def k(x):
        a = nl.ndarray((128, m), dtype=nl.bfloat16, buffer=nl.sbuf)
        b = nl.ndarray((128, n), dtype=nl.bfloat16, buffer=nl.sbuf)
        ps = nl.ndarray((min(m, 128), min(n, 512)), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=a, moving=b)  # LIMIT-MATMUL
        return x

    with pytest.raises(nki.NkiError) as e:
        k(np.zeros(1, np.float32))
    _expect_limit(e, words, value, "LIMIT-MATMUL")


def test_matmul_contraction_limit():
    @nki.jit
    def k(x):
        a = nl.zeros((64, 129), dtype=nl.float32)  # [M, K]: nl.matmul contracts over K
        b = nl.zeros((128, 64), dtype=nl.float32)
        nl.matmul(a, b)  # LIMIT-MATMUL-K
        return x

    with pytest.raises(nki.NkiError) as e:
        k(np.zeros(1, np.float32))
    _expect_limit(e, ["contraction dimension"], 129, "LIMIT-MATMUL-K")


def test_nc_matmul_dst_must_be_psum_fp32():
    @nki.jit
    def k(x):
        a = nl.zeros((128, 8), dtype=nl.float32)
        ps = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_matmul(dst=ps, stationary=a, moving=a)
        return x

    with pytest.raises(nki.NkiError, match="PSUM"):
        k(np.zeros(1, np.float32))


def test_out_of_bounds_slice_is_an_error_not_a_clamp():
    @nki.jit
    def k(x):
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[0:128, 0:64])  # LIMIT-OOB
        return x

    with pytest.raises(nki.NkiError) as e:
        k(np.zeros((100, 64), np.float32))
    assert "out of bounds" in str(e.value) and "128" in str(e.value)
    assert f"test_nki.py:{_line('LIMIT-OOB')}" in str(e.value)


def test_masked_load_beyond_bounds_without_mask_is_an_error():
    x = np.zeros((100, 8), np.float32)

    @nki.jit
    def k(x):
        i_p, i_f = nl.mgrid[0:128, 0:8]
        t = nl.load(x[i_p, i_f])
        return x

    with pytest.raises(nki.NkiError, match="out of bounds"):
        k(x)


# ----------------------------------------------------------------------------------------------- neuron device
torch = pytest.importorskip("torch")


def _neuron():
    import torch_neuronx  # noqa: F401

    if not hasattr(torch, "neuron") or torch.neuron.device_count() == 0:
        pytest.skip("no neuron device")
    return torch.device("neuron")


def test_neuron_tensors_no_copy():
    dev = _neuron()
    a = torch.randn(256, 1024, device=dev)
    b = torch.randn(256, 1024, device=dev)
    c = add_grid[2, 2](a, b)
    assert c.device.type == "neuron"
    torch.testing.assert_close(c.cpu(), (a + b).cpu(), rtol=0, atol=0)

    @nki.jit
    def scale_inplace(x):
        t = nl.load(x)
        nl.store(x, t * 2.0)
        return x

    x = torch.arange(12.0, device=dev).reshape(3, 4)
    ptr = x.data_ptr()
    r = scale_inplace(x)
    assert r is x and x.data_ptr() == ptr
    torch.testing.assert_close(x.cpu(), torch.arange(12.0).reshape(3, 4) * 2)

    # a strided view: the kernel sees exactly its elements
    base = torch.zeros(8, 8, device=dev)
    scale_inplace(base[::2, 1:5].fill_(1.0))
    ref = torch.zeros(8, 8)
    ref[::2, 1:5] = 2.0
    torch.testing.assert_close(base.cpu(), ref)


def test_neuron_bf16_matmul():
    dev = _neuron()
    lhsT = torch.randn(256, 128, device=dev, dtype=torch.bfloat16)
    rhs = torch.randn(256, 512, device=dev, dtype=torch.bfloat16)
    out = matmul_tiled(lhsT, rhs)
    assert out.device.type == "neuron" and out.dtype == torch.bfloat16
    ref = (lhsT.cpu().float().T @ rhs.cpu().float()).to(torch.bfloat16)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-2, atol=1e-2)


# ----------------------------------------------------------------------------------------------- Hub kernels
_HUB_INIT = '''
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit(platform_target="trn2")
def relu(x):
    assert x.shape[0] <= nl.tile_size.pmax
    src = sbuf.view(dtype=x.dtype, shape=x.shape)
    nisa.dma_copy(dst=src, src=x)
    res = sbuf.view(dtype=x.dtype, shape=x.shape)
    nisa.tensor_scalar(dst=res, data=src, op0=nl.maximum, operand0=0.0)
    out = hbm.view(dtype=x.dtype, shape=x.shape)
    nisa.dma_copy(dst=out, src=res)
    return out


from . import layers
'''

_HUB_LAYERS = '''
import torch

from .. import relu


class ReLU(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu(x)
'''


def _hub_repo(root: Path, name: str) -> Path:
    variant = root / name / "build" / "torch-neuron"
    (variant / "layers").mkdir(parents=True)
    (variant / "__init__.py").write_text(textwrap.dedent(_HUB_INIT))
    (variant / "layers" / "__init__.py").write_text(textwrap.dedent(_HUB_LAYERS))
    (variant / "metadata.json").write_text(json.dumps({
        "name": name.replace("_", "-"), "id": f"_{name}_neuron_test", "version": 1, "license": "Apache-2.0",
        "python-depends": ["nki"], "backend": {"type": "neuron"}}))
    return root / name


def test_hub_kernel_get_local_kernel(tmp_path, monkeypatch):
    dev = _neuron()
    kernels = pytest.importorskip("kernels")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    mod = kernels.get_local_kernel(_hub_repo(tmp_path, "relu_nki_local"))
    x = torch.randn(64, 96, device=dev)
    y = mod.relu(x)
    assert y.device.type == "neuron"
    assert torch.equal(y.cpu(), torch.relu(x).cpu())
    y = mod.layers.ReLU()(x.to(torch.bfloat16))
    assert torch.equal(y.cpu(), torch.relu(x.to(torch.bfloat16)).cpu())


def test_hub_kernelize_local_layer_repository(tmp_path, monkeypatch):
    dev = _neuron()
    kernels = pytest.importorskip("kernels")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = _hub_repo(tmp_path, "relu_nki_layer")

    @kernels.use_kernel_forward_from_hub("NkiTestReLU")
    class ReLU(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.relu(x)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 32)
            self.act = ReLU()

        def forward(self, x):
            return self.act(self.lin(x))

    model = Model().to(dev)
    x = torch.randn(16, 32, device=dev)
    ref = model(x).cpu()
    mapping = {"NkiTestReLU": {"neuron": kernels.LocalLayerRepository(repo_path=repo, layer_name="ReLU")}}
    calls = []
    with kernels.use_kernel_mapping(mapping):
        kmodel = kernels.kernelize(model, device="neuron", mode=kernels.Mode.INFERENCE)
        import nki as _nki

        orig = _nki.Kernel.__call__

        def spy(self, *a, **k):
            calls.append(self.__name__)
            return orig(self, *a, **k)

        monkeypatch.setattr(_nki.Kernel, "__call__", spy)
        out = kmodel(x)
    assert calls == ["relu"]
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), ref)


def test_tensor_tensor_scan_and_typing():
    import nki.typing as nt

    @nki.jit
    def k(a: nt.tensor, b: nt.tensor):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ta = nl.load(a)
        tb = nl.load(b)
        r = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=r, data0=ta, data1=tb, initial=0.5, op0=nl.multiply, op1=nl.add)
        nl.store(out, r)
        return out

    rng = np.random.default_rng(10)
    a = rng.random((16, 20), dtype=np.float32)
    b = rng.random((16, 20), dtype=np.float32)
    ref = np.empty_like(a)
    prev = np.full(16, 0.5, np.float32)
    for i in range(20):
        prev = a[:, i] * prev + b[:, i]
        ref[:, i] = prev
    np.testing.assert_allclose(k(a, b), ref, rtol=1e-6)


def test_older_idioms_psum_iadd_partition_broadcast_spmd_dim():
    @nki.jit
    def k(lhsT, rhs):
        K, M = lhsT.shape
        _, N = rhs.shape
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        a = nl.load(lhsT)
        b = nl.load(rhs)
        acc = nl.ndarray((2, nl.par_dim(M), N), dtype=nl.float32, buffer=nl.psum)  # NaN-filled
        for r in nl.affine_range(2):
            acc[1] += nisa.nc_matmul(a, b)  # first += of the group overwrites, the second accumulates
        s = nisa.tensor_copy(acc[1], dtype=nl.float32)
        mx = nl.max(s, axis=1)  # shape [M]: broadcasts along the free axis of [M, N]
        nl.store(out, nl.subtract(s, mx))
        return out

    rng = np.random.default_rng(11)
    lhsT = rng.integers(-2, 3, (64, 32)).astype(np.float32)
    rhs = rng.integers(-2, 3, (64, 48)).astype(np.float32)
    ref = 2 * (lhsT.T @ rhs)
    np.testing.assert_array_equal(k(lhsT, rhs), ref - ref.max(axis=1, keepdims=True))

    @nki.jit
    def ids(out):
        i = nl.program_id(0)
        t = nl.full((1, 1), i, dtype=nl.int32)
        nl.store(out[i:i + 1, :], t)
        return out

    out = np.full((6, 1), -1, np.int32)
    ids[nl.spmd_dim(3, nl.nc(2))](out)
    np.testing.assert_array_equal(out[:, 0], np.arange(6))


def test_hub_upstream_flow_offline_with_local_kernels(tmp_path, monkeypatch):
    """huggingface/kernels' test_basic::test_neuron and test_layer::test_hub_forward_neuron, with the Hub repo
    replaced by a local one through LOCAL_KERNELS (offline, `version=1` is not resolvable: revision="main")."""
    dev = _neuron()
    kernels = pytest.importorskip("kernels")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = _hub_repo(tmp_path, "relu_nki_upstream")
    monkeypatch.setenv("LOCAL_KERNELS", f"kernels-test/relu-nki={repo}")

    relu = kernels.get_kernel("kernels-test/relu-nki", revision="main")
    x = torch.randn((16, 16), dtype=torch.float16).to(device="neuron")
    torch.testing.assert_close(relu.relu(x), x.relu())

    @kernels.use_kernel_forward_from_hub("ReLU")
    class ReLUWithKernel(torch.nn.Module):
        n_calls = 0

        def forward(self, x):
            type(self).n_calls += 1
            return torch.nn.functional.relu(x)

    class SMOL(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 16)
            self.relu = ReLUWithKernel()

        def forward(self, x):
            return self.relu(self.linear(x))

    mapping = {"ReLU": {"neuron": kernels.LayerRepository(repo_id="kernels-test/relu-nki", revision="main",
                                                          layer_name="ReLU")}}
    X = torch.randn((16, 16), device=dev)
    with kernels.use_kernel_mapping(mapping):
        r = kernels.kernelize(ReLUWithKernel(), device="neuron", mode=kernels.Mode.INFERENCE)
    torch.testing.assert_close(r(X), X.relu())
    assert ReLUWithKernel.n_calls == 0
    smol = SMOL().to("neuron")
    Y = smol(X)
    with kernels.use_kernel_mapping(mapping):
        smol = kernels.kernelize(smol, mode=kernels.Mode.INFERENCE)  # device inferred from the parameters
    torch.testing.assert_close(smol(X), Y)
    assert ReLUWithKernel.n_calls == 1


@pytest.mark.parametrize("shape,engine_name,words,value", [
    ((32, 33), "vector", ["nc_transpose free dimension", "Vector Engine"], 33),
    ((64, 64), "vector", ["nc_transpose partition dimension", "Vector Engine"], 64),
])
def test_nc_transpose_limits(shape, engine_name, words, value):
    @nki.jit
    def k(x):
        t = nl.zeros(shape, dtype=nl.float32)
        d = nl.ndarray((shape[1], shape[0]), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_transpose(dst=d, data=t, engine=getattr(nisa.engine, engine_name))  # LIMIT-TRANSPOSE
        return x

    with pytest.raises(nki.NkiError) as e:
        k(np.zeros(1, np.float32))
    _expect_limit(e, words, value, "LIMIT-TRANSPOSE")


def test_api_rule_errors_name_the_kernel_line():
    @nki.jit
    def reduce_partitions(x):
        t = nl.zeros((128, 4), dtype=nl.float32)
        r = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.add, data=t, axis=0)  # RULE-REDUCE
        return x

    @nki.jit
    def compute_on_hbm(x):
        y = nl.exp(x)  # RULE-HBM
        return x

    for kern, marker, words in ((reduce_partitions, "RULE-REDUCE", "partition axis"),
                                (compute_on_hbm, "RULE-HBM", "SBUF/PSUM")):
        with pytest.raises(nki.NkiError) as e:
            kern(np.zeros((4, 4), np.float32))
        assert words in str(e.value) and f"test_nki.py:{_line(marker)}" in str(e.value), str(e.value)


def test_bn_stats_aggr_layernorm_stats_and_max8():
    @nki.jit
    def k(x, out):
        P, D = x.shape
        t = nl.load(x)
        stats = nl.ndarray((P, 6 * (D // 512)), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(D // 512):
            nisa.bn_stats(dst=stats[:, i * 6:(i + 1) * 6], data=t[:, i * 512:(i + 1) * 512])
        mv = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        m8 = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=m8, src=t)
        nl.store(out[:, 0:2], mv)
        nl.store(out[:, 2:10], m8)
        return out

    x = np.random.default_rng(12).standard_normal((64, 1024), dtype=np.float32)
    out = np.zeros((64, 10), np.float32)
    k(x, out)
    np.testing.assert_allclose(out[:, 0], x.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:, 1], x.var(axis=1), rtol=1e-4)
    np.testing.assert_array_equal(out[:, 2:], -np.sort(-x, axis=1)[:, :8])

    @nki.jit
    def too_wide(x):
        t = nl.load(x)
        s = nl.ndarray((64, 6), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=s, data=t)  # LIMIT-BN
        return x

    with pytest.raises(nki.NkiError) as e:
        too_wide(x)
    _expect_limit(e, ["bn_stats elements per partition"], 1024, "LIMIT-BN")


def test_cpu_torch_tensors_and_numpy_dtypes():
    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(x), 2.0))
        return out

    x = torch.randn(8, 16, dtype=torch.float16)
    y = double(x)
    assert isinstance(y, torch.Tensor) and y.device.type == "cpu" and y.dtype == torch.float16
    torch.testing.assert_close(y, x * 2)
    assert np.dtype(nl.float16) == np.float16 and nl.float32 == np.float32 and nl.bfloat16 == torch.bfloat16
