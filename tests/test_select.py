"""Selection and position-dependent operators (sort, topk, isin, nonzero, where(cond), tril/triu, arange,
advanced indexing and index_put_) run native kernels on neuron and match PyTorch CPU, errors included."""
import warnings

import pytest
import torch

import torch_neuronx

ALL = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16,
       torch.int8, torch.uint8, torch.bool]
NUMERIC = [t for t in ALL if t is not torch.bool]


def native(op):
    return torch_neuronx.op_counts().get(op, {}).get("native", 0)


def make(shape, dtype, seed=0, distinct=False):
    """Values with many ties (or none when distinct), and NaN/signed zeros for floats."""
    g = torch.Generator().manual_seed(seed)
    if distinct:
        n = 1
        for s in shape:
            n *= s
        x = torch.randperm(n, generator=g).reshape(shape).to(torch.float64) - n // 2
        return x.to(dtype)
    x = torch.randint(-4, 5, shape, generator=g).to(torch.float64)
    if dtype == torch.bool:
        return x > 0
    if dtype == torch.uint8:
        return x.abs().to(dtype)
    if dtype.is_floating_point:
        x = x / 2
        flat = x.view(-1)
        if flat.numel() >= 4:
            flat[:: 7] = -0.0
            flat[3::11] = float("nan")
            flat[5::13] = float("-inf")
    return x.to(dtype)


def dev(t):
    return t.to("neuron")


def same(a, b):
    assert a.device.type == "neuron"
    torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0, equal_nan=True)


def same_bits(a, b):
    same(a, b)
    if b.dtype.is_floating_point:
        assert torch.equal(torch.signbit(a.cpu()), torch.signbit(b))


def raises_like(fn_cpu, fn_dev):
    with pytest.raises(Exception) as e_cpu:
        fn_cpu()
    with pytest.raises(Exception) as e_dev:
        fn_dev()
    assert type(e_dev.value) is type(e_cpu.value)
    assert str(e_cpu.value).splitlines()[0] in str(e_dev.value)


SHAPES = [((7,), 0), ((3, 37), 1), ((5, 6, 4), 1), ((2, 3, 300), -1), ((4, 0), 1), ((0, 5), 1), ((), 0)]


@pytest.mark.parametrize("dtype", ALL + [torch.uint16, torch.uint32, torch.uint64])
def test_sort_stable(dtype):
    for shape, dim in SHAPES:
        x = make(shape, torch.int64 if dtype in (torch.uint16, torch.uint32, torch.uint64) else dtype)
        x = x.abs().to(dtype) if dtype in (torch.uint16, torch.uint32, torch.uint64) else x
        for desc in (False, True):
            before = native("aten::sort.values_stable")
            v, i = torch.sort(dev(x), dim=dim, descending=desc, stable=True)
            vc, ic = torch.sort(x, dim=dim, descending=desc, stable=True)
            same_bits(v, vc)
            same(i, ic)
            assert native("aten::sort.values_stable") == before + 1
            # stable=False: CPU leaves the order of ties open; values and consistency are what it promises.
            v2, i2 = torch.sort(dev(x), dim=dim, descending=desc)
            same(v2, vc)
            if x.dim():
                same(torch.gather(dev(x), dim, i2), vc)


# The dtypes the CPU sorts with the C++ library's introsort when stable=False: its tie order is
# reproducible, and OpInfo compares argsort/msort indices (and their gradients) with it.
INTROSORT = [torch.bfloat16, torch.float16, torch.int16, torch.int8, torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", INTROSORT)
def test_sort_unstable_ties_match_cpu(dtype):
    # Long rows take every branch: partitions, the heap sort past the depth budget (many ties), the
    # final insertion pass; the short ones only the insertion sort.
    shapes = SHAPES + [((8000,), 0), ((3, 1000), 1), ((1000, 3), 0), ((17,), 0), ((2, 33), 1)]
    for shape, dim in shapes:
        x = make(shape, dtype, seed=5)
        for desc in (False, True):
            v, i = torch.sort(dev(x), dim=dim, descending=desc)
            vc, ic = torch.sort(x, dim=dim, descending=desc)
            same_bits(v, vc)
            same(i, ic)
            same(torch.argsort(dev(x), dim=dim, descending=desc), torch.argsort(x, dim=dim, descending=desc))
    x = make((6, 50), dtype, seed=6).t()  # strided rows
    same(torch.sort(dev(x), dim=0)[1], torch.sort(x, dim=0)[1])
    e = make((1,), dtype).expand(40)  # stride 0: the CPU returns indices in order
    same(torch.sort(dev(make((1,), dtype)).expand(40))[1], torch.sort(e)[1])
    if dtype.is_floating_point:
        same(torch.msort(dev(make((500, 3), dtype, seed=7))), torch.msort(make((500, 3), dtype, seed=7)))


def test_sort_strided_and_out():
    x = make((6, 40), torch.float32, seed=3).t()  # non-contiguous
    same(torch.sort(dev(x).t().t(), dim=0, stable=True)[1], torch.sort(x, dim=0, stable=True)[1])
    xd = dev(x)
    vo = torch.empty(0, device="neuron")
    io = torch.empty(0, dtype=torch.long, device="neuron")
    torch.sort(xd, dim=1, stable=True, out=(vo, io))
    vc, ic = torch.sort(x, dim=1, stable=True)
    same(vo, vc)
    same(io, ic)
    same(torch.argsort(xd, dim=0, stable=True), torch.argsort(x, dim=0, stable=True))
    raises_like(lambda: torch.sort(x, dim=2), lambda: torch.sort(xd, dim=2))


@pytest.mark.parametrize("dtype", NUMERIC)
def test_topk(dtype):
    for shape, dim in SHAPES:
        if not shape or shape[dim] == 0:
            continue
        for distinct in (True, False):
            x = make(shape, dtype, seed=1, distinct=distinct and dtype not in (torch.int8, torch.uint8))
            n = x.shape[dim]
            for k in sorted({0, 1, 2, n // 2, n - 1, n}):
                if k < 0:
                    continue
                for largest in (True, False):
                    before = native("aten::topk.values")
                    v, i = torch.topk(dev(x), k, dim=dim, largest=largest)
                    vc, ic = torch.topk(x, k, dim=dim, largest=largest)
                    assert native("aten::topk.values") == before + 1
                    same(v, vc)
                    # Indices of tied values are not fixed by the CPU; they must select the values.
                    same(torch.gather(dev(x), dim, i), vc)
                    if distinct and x.dtype.is_floating_point and dtype != torch.bfloat16:
                        same(i, ic)
                    vu, _ = torch.topk(dev(x), k, dim=dim, largest=largest, sorted=False)
                    same(vu.sort(dim=dim)[0], vc.sort(dim=dim)[0])


def test_topk_edge_cases():
    x = torch.tensor(3.5)
    same(torch.topk(dev(x), 1)[0], torch.topk(x, 1)[0])
    y = make((4, 9), torch.float32)
    raises_like(lambda: torch.topk(y, 10), lambda: torch.topk(dev(y), 10))
    raises_like(lambda: torch.topk(y, -1), lambda: torch.topk(dev(y), -1))
    raises_like(lambda: torch.topk(y > 0, 1), lambda: torch.topk(dev(y) > 0, 1))  # bool: CPU has no kernel
    ys = y[:, ::2]
    same(torch.topk(dev(y)[:, ::2], 3, dim=1)[0], torch.topk(ys, 3, dim=1)[0])


@pytest.mark.parametrize("dtype", NUMERIC)
def test_isin(dtype):
    el = make((5, 7), dtype, seed=2)
    te = make((6,), dtype, seed=4)
    for a, b in [(el, te), (el.t(), te[::2]), (el, te[:0]), (el[:0], te)]:
        for invert in (False, True):
            before = native("aten::isin.Tensor_Tensor_out")
            same(torch.isin(dev(a), dev(b), invert=invert), torch.isin(a, b, invert=invert))
            assert native("aten::isin.Tensor_Tensor_out") == before + 1
    if dtype == torch.int64:
        same(torch.isin(dev(el), dev(te.to(torch.int32))), torch.isin(el, te.to(torch.int32)))  # mixed dtypes
        big = torch.arange(100) * 3
        same(torch.isin(dev(el), dev(big)), torch.isin(el, big))


@pytest.mark.parametrize("dtype", ALL)
def test_nonzero_and_where(dtype):
    for shape in [(9,), (3, 5), (2, 3, 4), (2, 0, 3), ()]:
        x = make(shape, dtype, seed=5)
        before = native("aten::nonzero")
        same(torch.nonzero(dev(x)), torch.nonzero(x))
        assert native("aten::nonzero") == before + 1
        for a, b in zip(torch.where(dev(x)), torch.where(x)):
            same(a, b)
    x = make((4, 6), dtype, seed=6).t()
    same(torch.nonzero(dev(make((4, 6), dtype, seed=6)).t()), torch.nonzero(x))
    same(torch.nonzero(dev(x), as_tuple=True)[1], torch.nonzero(x, as_tuple=True)[1])
    out = torch.empty(0, dtype=torch.long, device="neuron")
    torch.nonzero(dev(x), out=out)
    same(out, torch.nonzero(x))


def test_nonzero_errors_and_masks():
    x = make((3, 4), torch.float32)
    raises_like(lambda: torch.nonzero(x, out=torch.empty(0)), lambda: torch.nonzero(dev(x), out=dev(torch.empty(0))))
    raises_like(lambda: torch.nonzero(x.to(torch.uint16)), lambda: torch.nonzero(dev(x.to(torch.uint16))))
    m = x > 0
    same(dev(x)[dev(m)], x[m])
    same(dev(x).masked_select(dev(m)), x.masked_select(m))


@pytest.mark.parametrize("dtype", ALL)
def test_tril_triu(dtype):
    for shape in [(5, 7), (7, 5), (2, 3, 4, 6), (0, 3), (3, 0, 2)]:
        x = make(shape, dtype, seed=7)
        for k in (-8, -2, -1, 0, 1, 3, 9):
            for name in ("tril", "triu"):
                before = native(f"aten::{name}.out")
                same_bits(getattr(torch, name)(dev(x), k), getattr(torch, name)(x, k))
                assert native(f"aten::{name}.out") == before + 1
                y, yd = x.clone(), dev(x)
                getattr(yd, name + "_")(k)
                getattr(y, name + "_")(k)
                same_bits(yd, y)
    x = make((6, 4), dtype, seed=8).t()  # strided
    same(torch.tril(dev(make((6, 4), dtype, seed=8)).t(), 1), torch.tril(x, 1))
    raises_like(lambda: torch.tril(torch.ones(3)), lambda: torch.tril(dev(torch.ones(3))))


@pytest.mark.parametrize("dtype", NUMERIC)
def test_arange(dtype):
    cases = [(0, 10, 1), (3, 20, 4), (10, -7, -3), (5, 5, 1), (-6, 0, 2)]
    if dtype in (torch.int8, torch.uint8):
        cases.append((0, 300, 7))  # wraps as on the CPU
    for start, end, step in cases:
        if dtype == torch.uint8 and (start < 0 or end < 0):
            continue
        before = native("aten::arange.start_out")
        same(torch.arange(start, end, step, dtype=dtype, device="neuron"), torch.arange(start, end, step, dtype=dtype))
        assert native("aten::arange.start_out") == before + 1
    if dtype.is_floating_point:
        # Fractional or huge: the CPU kernel's own roundings (declined by the native path, same result).
        same(torch.arange(0.1, 2.0, 0.3, dtype=dtype, device="neuron"), torch.arange(0.1, 2.0, 0.3, dtype=dtype))
        same(torch.arange(2**30, 2**30 + 400, 3, dtype=dtype, device="neuron"),
             torch.arange(2**30, 2**30 + 400, 3, dtype=dtype))


def test_arange_out_and_errors():
    same(torch.arange(7, device="neuron"), torch.arange(7))
    out = torch.empty(0, dtype=torch.int32, device="neuron")
    torch.arange(2, 9, out=out)
    same(out, torch.arange(2, 9, dtype=torch.int32))
    o2 = torch.empty(5, device="neuron")[::2]  # strided 1-d out of the right size
    torch.arange(3, out=o2)
    same(o2, torch.arange(3, dtype=torch.float32))
    with warnings.catch_warnings(record=True) as w_cpu:
        warnings.simplefilter("always")
        torch.arange(4, out=torch.empty(2, 2))
    with warnings.catch_warnings(record=True) as w_dev:
        warnings.simplefilter("always")
        o3 = torch.empty(2, 2, device="neuron")
        torch.arange(4, out=o3)
    assert [str(w.message) for w in w_dev] == [str(w.message) for w in w_cpu]
    same(o3, torch.arange(4, out=torch.empty(2, 2)))
    raises_like(lambda: torch.arange(0, 10, 0), lambda: torch.arange(0, 10, 0, device="neuron"))
    raises_like(lambda: torch.arange(10, 0, 1), lambda: torch.arange(10, 0, 1, device="neuron"))
    raises_like(lambda: torch.arange(3, dtype=torch.bool), lambda: torch.arange(3, dtype=torch.bool, device="neuron"))


def index_cases(x):
    g = torch.Generator().manual_seed(9)
    i0 = torch.randint(-x.shape[0], x.shape[0], (4,), generator=g)
    i1 = torch.randint(0, x.shape[1], (2, 1), generator=g)
    i2 = torch.randint(0, x.shape[2], (3,), generator=g).to(torch.int32)
    return [
        (i0,),
        (slice(None), i1),
        (i0[:2].view(2, 1), slice(None), i2),  # non-adjacent: indexed dims go first
        (slice(None), i1, i2),  # broadcast [2, 1] with [3]
        (i0[0],),  # 0-d index
        (x[..., 0] > 0,),  # bool mask
        (slice(None), torch.tensor([], dtype=torch.long)),
        (Ellipsis, i2),
    ]


def dev_key(key):
    return tuple(dev(k) if isinstance(k, torch.Tensor) else k for k in key)


@pytest.mark.parametrize("dtype", ALL)
def test_index(dtype):
    x = make((5, 4, 3), dtype, seed=10)
    for key in index_cases(x):
        if len(key) == 1 and isinstance(key[0], torch.Tensor) and key[0].dim() == 0:
            # Python turns a 0-d integer key into select(); the operator itself takes it as an index.
            same_bits(torch.ops.aten.index.Tensor(dev(x), [dev(key[0])]), torch.ops.aten.index.Tensor(x, [key[0]]))
            continue
        before = native("aten::index.Tensor_out")
        same_bits(dev(x)[dev_key(key)], x[key])
        assert native("aten::index.Tensor_out") == before + 1
        same_bits(dev(x)[key], x[key])  # CPU indices
    xt = x.transpose(0, 2)
    same(dev(x).transpose(0, 2)[:, torch.tensor([2, 0])], xt[:, torch.tensor([2, 0])])


def test_index_errors():
    x = make((3, 4), torch.float32)
    for key in [(torch.tensor([5]),), (slice(None), torch.tensor([-5])), (torch.tensor([1, 2]), torch.tensor([0, 1, 2])),
                (torch.tensor([0.5]),), (torch.tensor([True, False]),)]:
        raises_like(lambda: x[key], lambda: dev(x)[dev_key(key)])


@pytest.mark.parametrize("dtype", ALL)
def test_index_put(dtype):
    x = make((5, 4, 3), dtype, seed=11)
    for key in index_cases(x):
        shape = x[key].shape
        v = make(shape, dtype, seed=12)
        for accumulate in (False, True):
            if accumulate and dtype == torch.bool:
                continue
            idx = _tensors(key, x)
            hits = put(torch.zeros(x.shape, dtype=torch.long), idx, torch.ones(shape, dtype=torch.long), True)
            if not accumulate and hits.max() > 1:
                continue  # duplicate targets: the CPU leaves the winner unspecified
            y, yd = x.clone(), dev(x)
            before = native("aten::_index_put_impl_")
            put(yd, [None if k is None else dev(k) for k in idx], dev(v), accumulate)
            put(y, idx, v, accumulate)
            assert native("aten::_index_put_impl_") == before + 1
            same(yd, y)
    # Broadcast values, a CPU scalar, setitem syntax.
    y, yd = x.clone(), dev(x)
    y[:, torch.tensor([1, 3])] = x[0, 0]
    yd[:, dev(torch.tensor([1, 3]))] = x[0, 0]
    same(yd, y)
    m = x > 0 if dtype != torch.bool else x
    y[m] = make((), dtype, seed=13)
    yd[dev(m)] = make((), dtype, seed=13)
    same(yd, y)


def put(x, indices, values, accumulate):
    """index_put_ with None entries for unindexed dims (the operator's form)."""
    return torch.ops.aten.index_put_(x, list(indices), values, accumulate)


def _tensors(key, x):
    """The index_put_ form of a __getitem__ key (slices become None entries, Ellipsis expands)."""
    out = []
    for k in key:
        if k is Ellipsis:
            out.extend([None] * (x.dim() - (len(key) - 1)))
        elif isinstance(k, slice):
            out.append(None)
        else:
            out.append(k)
    return tuple(out)


def test_index_put_accumulate_duplicates():
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = torch.zeros(4, 3, dtype=dtype)
        idx = torch.tensor([1, 1, 3, 1, 0])
        v = make((5, 3), dtype, seed=14, distinct=True)
        y, yd = x.clone(), dev(x)
        y.index_put_((idx,), v, accumulate=True)
        yd.index_put_((dev(idx),), dev(v), accumulate=True)
        same(yd, y)
    x = make((3, 4), torch.float32)
    raises_like(lambda: x.clone().index_put_((torch.tensor([3]),), torch.tensor(1.0)),
                lambda: dev(x).index_put_((dev(torch.tensor([3])),), torch.tensor(1.0)))
    raises_like(lambda: x.clone().index_put_((torch.tensor([0]),), torch.ones(2, 4)),
                lambda: dev(x).index_put_((dev(torch.tensor([0])),), dev(torch.ones(2, 4))))
    raises_like(lambda: x.clone().index_put_((torch.tensor([0]),), torch.ones(4, dtype=torch.float64)),
                lambda: dev(x).index_put_((dev(torch.tensor([0])),), dev(torch.ones(4, dtype=torch.float64))))


def test_wrong_out_dtypes_raise_like_cpu():
    x = make((4, 6), torch.float32, seed=15)
    xd = dev(x)

    def outs(*dtypes, device="cpu"):
        return tuple(torch.empty(0, dtype=d, device=device) for d in dtypes)

    raises_like(lambda: torch.sort(x, out=outs(torch.float32, torch.int32)),
                lambda: torch.sort(xd, out=outs(torch.float32, torch.int32, device="neuron")))
    raises_like(lambda: torch.topk(x, 2, out=outs(torch.float64, torch.int64)),
                lambda: torch.topk(xd, 2, out=outs(torch.float64, torch.int64, device="neuron")))
    raises_like(lambda: torch.isin(x, x[0], out=outs(torch.float32)[0]),
                lambda: torch.isin(xd, xd[0], out=outs(torch.float32, device="neuron")[0]))
    raises_like(lambda: torch.tril(x, out=outs(torch.int64)[0]),
                lambda: torch.tril(xd, out=outs(torch.int64, device="neuron")[0]))
