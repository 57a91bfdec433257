"""Hypothesis strategies for the property tests (tests/test_properties.py): tensors of random shape (0 and 1
included), dtype and layout, built the same way on CPU and on neuron so that the two runs see the same values in
the same strides.

A drawn tensor is a `Case`: a contiguous CPU base plus the view steps that make the logical tensor from it
(transpose back from a permuted base, a step-2 slice, an expand of a size-1 dim (stride 0), an overlapping
as_strided window). `case.cpu()` and `case.neuron()` apply the steps to the base on each device.
"""
import dataclasses
from typing import Callable, List, Sequence, Tuple

import torch
from hypothesis import strategies as st

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
INTS = (torch.int64, torch.int32, torch.int16, torch.uint8)

# Layouts a read-only input can take. "overlapping" aliases elements (legal only where nothing writes to it).
LAYOUTS = ("contiguous", "transposed", "sliced", "expanded", "overlapping")


@dataclasses.dataclass
class Case:
    base: torch.Tensor
    steps: List[Tuple[str, tuple]]
    layout: str

    def _apply(self, t):
        for name, args in self.steps:
            t = getattr(t, name)(*args)
        return t

    def cpu(self):
        return self._apply(self.base.clone())

    def neuron(self):
        return self._apply(self.base.to("neuron"))

    def __repr__(self):
        t = self.cpu()
        return (f"Case({self.layout}, shape={tuple(t.shape)}, stride={tuple(t.stride())}, dtype={t.dtype}, "
                f"steps={self.steps})")


def values(shape, dtype, seed, low=-4.0, high=4.0):
    """Deterministic values of `dtype`: floats in [low, high), integers in a small range that keeps products and
    sums exact."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype)
    lo = 0 if dtype == torch.uint8 else -5
    return torch.randint(lo, 6, shape, generator=g).to(dtype)


def dims(min_dims=0, max_dims=4, min_side=0, max_side=6):
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


@st.composite
def tensors(draw, shape, dtype, layouts=LAYOUTS, low=-4.0, high=4.0):
    """A Case of the logical `shape` and `dtype` in one of `layouts` (falling back to contiguous where a layout
    cannot apply to the shape)."""
    seed = draw(st.integers(0, 2**31 - 1))
    layout = draw(st.sampled_from(layouts))
    shape = tuple(shape)
    nd = len(shape)
    if layout == "transposed" and nd >= 2:
        perm = list(range(nd))
        i, j = draw(st.sampled_from([(a, b) for a in range(nd) for b in range(a + 1, nd)]))
        perm[i], perm[j] = perm[j], perm[i]
        base = values(tuple(shape[p] for p in perm), dtype, seed, low, high)
        return Case(base, [("permute", tuple(perm))], layout)
    if layout == "sliced" and nd >= 1:
        d = draw(st.integers(0, nd - 1))
        big = list(shape)
        big[d] = 2 * shape[d]
        base = values(tuple(big), dtype, seed, low, high)
        start, length = (1, 2 * shape[d] - 1) if shape[d] else (0, 0)
        return Case(base, [("narrow", (d, start, length)), ("__getitem__", (_step2(nd, d),))], layout)
    if layout == "expanded" and any(s > 1 for s in shape):
        d = draw(st.sampled_from([i for i, s in enumerate(shape) if s > 1]))
        small = list(shape)
        small[d] = 1
        base = values(tuple(small), dtype, seed, low, high)
        return Case(base, [("expand", (shape,))], layout)
    if layout == "overlapping" and nd >= 1 and all(s > 0 for s in shape):
        # Each row starts one element after the previous one: consecutive rows share all but one element.
        strides = [1] * nd
        span = sum((s - 1) for s in shape) + 1
        base = values((span,), dtype, seed, low, high)
        return Case(base, [("as_strided", (shape, tuple(strides)))], layout)
    return Case(values(shape, dtype, seed, low, high), [], "contiguous")


def _step2(nd, d):
    idx = [slice(None)] * nd
    idx[d] = slice(None, None, 2)
    return tuple(idx)


def broadcastable(shape: Sequence[int]):
    """A shape that broadcasts with `shape`: some leading dims dropped, some sizes replaced by 1."""
    return st.integers(0, len(shape)).flatmap(
        lambda drop: st.lists(st.booleans(), min_size=len(shape) - drop, max_size=len(shape) - drop).map(
            lambda ones: tuple(1 if one else s for one, s in zip(ones, shape[drop:]))))


def tolerance(dtype, scale=1.0):
    """assert_close tolerances: PyTorch's defaults, times `scale` for results that sum many rounded terms."""
    rtol = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float32: 1.3e-6, torch.float64: 1e-7}.get(dtype, 0)
    atol = {torch.float16: 1e-5, torch.bfloat16: 1e-5, torch.float32: 1e-5, torch.float64: 1e-7}.get(dtype, 0)
    return dict(rtol=rtol * scale, atol=atol * scale)


def same(fn: Callable, *cases, scale=1.0, atol=None, ref64=False, **kw):
    """Runs fn on the CPU forms and on the neuron forms of the cases; results (tensors or tuples of them) must
    match CPU's, or both must raise the same error type. atol: an absolute tolerance for results whose
    intermediate rounding is the implementation's choice (half-precision attention, say). ref64: fn computes the
    exact result from float64 inputs (pointwise ops), see below."""
    cpu_args = [c.cpu() if hasattr(c, "neuron") else c for c in cases]
    dev_args = [c.neuron() if hasattr(c, "neuron") else c for c in cases]
    try:
        want = fn(*cpu_args, **kw)
    except (RuntimeError, ValueError, IndexError, TypeError) as e:
        err = type(e)
        try:
            fn(*dev_args, **kw)
        except err:
            return None
        raise AssertionError(f"CPU raised {err.__name__}: {e}; neuron raised nothing")
    got = fn(*dev_args, **kw)
    try:
        _check(got, want, scale, atol)
    except AssertionError:
        if not ref64:
            raise
        # CPU itself rounds half-precision intermediates on some paths and not on others (its scalar loop
        # rounds alpha * b, its vector loop fuses it; a 0-dim float32 operand is rounded to bfloat16 first): a
        # neuron result may differ from CPU's and be closer to the exact one. Accept a result no further from
        # the float64 computation than CPU's, plus one rounding of the result.
        exact = fn(*[_upcast(c.cpu()) if hasattr(c, "neuron") else c for c in cases], **kw)
        _no_worse(got, want, exact)
    return want


def _upcast(t):
    return t.double() if t.is_floating_point() else t


def _no_worse(got, want, exact):
    if isinstance(want, (tuple, list)):
        for g, w, e in zip(got, want, exact):
            _no_worse(g, w, e)
        return
    if not isinstance(want, torch.Tensor) or not want.is_floating_point() or want.dtype not in (torch.bfloat16,
                                                                                               torch.float16):
        _check(got, want, 1.0)
        return
    eps = torch.finfo(want.dtype).eps
    e = exact.double()
    err_got, err_cpu = (got.cpu().double() - e).abs(), (want.double() - e).abs()
    allowed = err_cpu + eps * e.abs() + torch.finfo(want.dtype).tiny
    bad = ~((err_got <= allowed) | (err_got.isnan() & err_cpu.isnan()))
    assert not bad.any(), (f"{int(bad.sum())} elements further from the exact result than CPU's by more than one "
                           f"rounding: neuron {got.cpu()[bad][:5].tolist()}, CPU {want[bad][:5].tolist()}, exact "
                           f"{e[bad][:5].tolist()}")


def _check(got, want, scale, atol=None):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want):
            _check(g, w, scale, atol)
        return
    if not isinstance(want, torch.Tensor):
        assert got == want, (got, want)
        return
    assert got.device.type == "neuron", got.device
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    tol = tolerance(want.dtype, scale)
    if atol is not None:
        tol["atol"] = max(tol["atol"], atol)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **tol)
