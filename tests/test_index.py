"""Indexing operators on neuron run native kernels and match PyTorch CPU, errors included."""
import pytest
import torch

import torch_neuronx

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]
ACC_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8]


def native(op):
    return torch_neuronx.op_counts().get(op, {}).get("native", 0)


def make(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 10
    if dtype == torch.bool:
        return x > 0
    if not dtype.is_floating_point:
        x = x.abs() if dtype == torch.uint8 else x
    return x.to(dtype)


def dev(t):
    return t.to("neuron")


def same(a, b):
    assert a.device.type == "neuron"
    torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)


def raises_like(fn_cpu, fn_dev):
    with pytest.raises(Exception) as e_cpu:
        fn_cpu()
    with pytest.raises(Exception) as e_dev:
        fn_dev()
    assert type(e_dev.value) is type(e_cpu.value)
    assert str(e_cpu.value).splitlines()[0] in str(e_dev.value)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select(dtype):
    x = make((5, 7, 3), dtype)
    for dim, idx in [(0, [4, 0, 4, 2]), (1, [6, 1]), (2, [2, 2, 0, 1, 1]), (-1, [0]), (1, [])]:
        i = torch.tensor(idx, dtype=torch.long)
        before = native("aten::index_select")
        same(dev(x).index_select(dim, dev(i)), x.index_select(dim, i))
        same(dev(x).index_select(dim, i), x.index_select(dim, i))  # CPU index, neuron self
        assert native("aten::index_select") == before + 2
    xt = x.transpose(0, 2)  # strided source
    i = torch.tensor([1, 0, 1], dtype=torch.int32)
    same(dev(x).transpose(0, 2).index_select(1, dev(i)), xt.index_select(1, i))
    same(dev(x).index_select(0, torch.tensor(3)), x.index_select(0, torch.tensor(3)))  # 0-d index


def test_index_select_errors():
    x = make((3, 4), torch.float32)
    raises_like(lambda: x.index_select(0, torch.tensor([5])), lambda: dev(x).index_select(0, dev(torch.tensor([5]))))
    raises_like(lambda: x.index_select(0, torch.tensor([-1])), lambda: dev(x).index_select(0, torch.tensor([-1])))
    raises_like(lambda: x.index_select(0, torch.tensor([0.5])), lambda: dev(x).index_select(0, torch.tensor([0.5])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_forward_backward(dtype):
    w = make((11, 6), dtype)
    ids = torch.tensor([[1, 3, 3, 10], [0, 2, 3, 1]])
    for kw in [{}, {"padding_idx": 3}, {"scale_grad_by_freq": True}]:
        wc = w.clone().requires_grad_()
        wd = dev(w).requires_grad_()
        out_c = torch.nn.functional.embedding(ids, wc, **kw)
        before = native("aten::embedding_dense_backward")
        out_d = torch.nn.functional.embedding(dev(ids), wd, **kw)
        same(out_d.detach(), out_c.detach())
        g = make(out_c.shape, dtype, seed=1)
        out_c.backward(g)
        out_d.backward(dev(g))
        assert native("aten::embedding_dense_backward") == before + 1
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(wd.grad.cpu(), wc.grad, atol=tol, rtol=tol)
    raises_like(lambda: torch.nn.functional.embedding(torch.tensor([11]), w),
                lambda: torch.nn.functional.embedding(dev(torch.tensor([11])), dev(w)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather(dtype):
    x = make((4, 5, 3), dtype)
    g = torch.Generator().manual_seed(2)
    for dim in (0, 1, -1):
        size = x.shape[dim]
        idx = torch.randint(0, size, (3, 4, 2), generator=g)
        before = native("aten::gather")
        same(torch.gather(dev(x), dim, dev(idx)), torch.gather(x, dim, idx))
        same(torch.gather(dev(x), dim, idx), torch.gather(x, dim, idx))
        assert native("aten::gather") == before + 2
    idx = torch.randint(0, 4, (2, 3, 4), generator=g).transpose(0, 2)  # strided index
    same(torch.gather(dev(x), 0, dev(idx)), torch.gather(x, 0, idx))


def test_gather_autograd_and_errors():
    x = make((4, 5), torch.float32)
    idx = torch.tensor([[0, 3], [2, 2], [1, 0]])
    xc, xd = x.clone().requires_grad_(), dev(x).requires_grad_()
    torch.gather(xc, 1, idx).pow(2).sum().backward()
    torch.gather(xd, 1, dev(idx)).pow(2).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)
    raises_like(lambda: torch.gather(x, 1, torch.tensor([[5]])), lambda: torch.gather(dev(x), 1, torch.tensor([[5]])))
    raises_like(lambda: torch.gather(x, 1, torch.tensor([[-1]])), lambda: torch.gather(dev(x), 1, torch.tensor([[-1]])))
    i32 = torch.tensor([[0, 4]], dtype=torch.int32)
    same(torch.gather(dev(x), 1, dev(i32)), torch.gather(x, 1, i32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter(dtype):
    x = make((5, 4), dtype)
    src = make((3, 4), dtype, seed=3)
    idx = torch.tensor([[0, 1, 2, 3], [4, 0, 1, 2], [3, 4, 0, 1]])  # no duplicates within a column
    for dim, i in [(0, idx), (1, idx[:, :2] % 4)]:
        same(dev(x).scatter_(dim, dev(i), dev(src)), x.clone().scatter_(dim, i, src))
        same(torch.scatter(dev(x), dim, i, dev(src)), torch.scatter(x, dim, i, src))
        same(dev(x).scatter_(dim, dev(i), 1), x.clone().scatter_(dim, i, 1))
    assert native("aten::scatter_.src") > 0 and native("aten::scatter.value") + native("aten::scatter_.value") > 0


@pytest.mark.parametrize("dtype", ACC_DTYPES)
def test_scatter_add_duplicates(dtype):
    x = make((4, 3), dtype)
    src = make((6, 3), dtype, seed=4)
    idx = torch.tensor([[0, 1, 1], [3, 3, 0], [0, 0, 0], [1, 2, 3], [3, 3, 3], [0, 1, 2]])
    before = native("aten::scatter_add_")
    out = dev(x).scatter_add_(0, dev(idx), dev(src))
    assert native("aten::scatter_add_") == before + 1
    ref = x.clone().scatter_add_(0, idx, src)
    tol = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 0
    torch.testing.assert_close(out.cpu(), ref, atol=tol, rtol=tol)
    same(torch.scatter_add(dev(x), 0, idx, dev(src)), x.scatter_add(0, idx, src)) if tol == 0 else None
    raises_like(lambda: x.clone().scatter_add_(0, torch.tensor([[4]]), src),
                lambda: dev(x).scatter_add_(0, torch.tensor([[4]]), dev(src)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_copy(dtype):
    cache = make((1, 3, 10, 4), dtype)
    new = make((1, 3, 2, 4), dtype, seed=5)
    pos = torch.tensor([7, 2])
    before = native("aten::index_copy_")
    c = dev(cache)
    c.index_copy_(2, dev(pos), dev(new))
    same(c, cache.clone().index_copy_(2, pos, new))
    c.index_copy_(2, pos, dev(new))  # CPU index
    assert native("aten::index_copy_") == before + 2
    same(torch.index_copy(dev(cache), 0, torch.tensor([0]), dev(cache)), cache)
    t = dev(cache).transpose(1, 2)  # strided destination
    t.index_copy_(1, dev(torch.tensor([1])), dev(new[:, :, :1].transpose(1, 2)))
    ref = cache.clone().transpose(1, 2)
    ref.index_copy_(1, torch.tensor([1]), new[:, :, :1].transpose(1, 2))
    same(t, ref)


def test_index_copy_errors():
    x = make((3, 4), torch.float32)
    raises_like(lambda: x.clone().index_copy_(0, torch.tensor([5]), x[:1]),
                lambda: dev(x).index_copy_(0, torch.tensor([5]), dev(x[:1])))
    raises_like(lambda: x.clone().index_copy_(0, torch.tensor([-1]), x[:1]),
                lambda: dev(x).index_copy_(0, torch.tensor([-1]), dev(x[:1])))
    raises_like(lambda: x.clone().index_copy_(0, torch.tensor([0], dtype=torch.int32), x[:1]),
                lambda: dev(x).index_copy_(0, torch.tensor([0], dtype=torch.int32), dev(x[:1])))
    d = dev(x)
    with pytest.raises(IndexError):
        d.index_copy_(0, torch.tensor([1, 7]), dev(x[:2] + 1))
    same(d, x)  # an error leaves the destination untouched


@pytest.mark.parametrize("dtype", ACC_DTYPES)
def test_index_add(dtype):
    x = make((5, 3), dtype)
    src = make((4, 3), dtype, seed=6)
    idx = torch.tensor([4, 0, 4, 4])
    alpha = 2 if not dtype.is_floating_point else 0.5
    before = native("aten::index_add_")
    out = dev(x).index_add_(0, dev(idx), dev(src), alpha=alpha)
    assert native("aten::index_add_") == before + 1
    tol = 3e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-6
    torch.testing.assert_close(out.cpu(), x.clone().index_add_(0, idx, src, alpha=alpha), atol=tol, rtol=tol)
    src2 = make((2, 5), dtype, seed=7).T  # strided source
    i32 = torch.tensor([2, 2], dtype=torch.int32)
    out = torch.index_add(dev(x), 1, i32, dev(src2))
    torch.testing.assert_close(out.cpu(), torch.index_add(x, 1, i32, src2), atol=tol, rtol=tol)
    raises_like(lambda: x.clone().index_add_(0, torch.tensor([5]), src[:1]),
                lambda: dev(x).index_add_(0, torch.tensor([5]), dev(src[:1])))


def test_zero_size():
    x = make((0, 3), torch.float32)
    same(dev(x).index_select(0, torch.tensor([], dtype=torch.long)), x.index_select(0, torch.tensor([], dtype=torch.long)))
    y = make((3, 0), torch.float32)
    same(dev(y).index_select(0, torch.tensor([2, 0])), y.index_select(0, torch.tensor([2, 0])))
    same(torch.gather(dev(y), 1, torch.zeros(3, 0, dtype=torch.long)), torch.gather(y, 1, torch.zeros(3, 0, dtype=torch.long)))


def test_cat():
    a = make((2, 3, 4), torch.float32)
    b = make((2, 5, 4), torch.bfloat16, seed=1)
    c = make((2, 1, 4), torch.int64, seed=2)
    before = native("aten::cat")
    for dim in (1, -2):
        same(torch.cat([dev(a), dev(b), dev(c)], dim), torch.cat([a, b, c], dim))  # promotion like the CPU
    assert native("aten::cat") == before + 2
    same(torch.cat([dev(a), dev(a.transpose(0, 1).contiguous().transpose(0, 1))], 0), torch.cat([a, a], 0))
    same(torch.cat([dev(a), dev(torch.empty(0)), dev(a)], 2), torch.cat([a, torch.empty(0), a], 2))  # legacy empty
    same(torch.cat([dev(a[:, :0]), dev(a)], 1), torch.cat([a[:, :0], a], 1))
    ks = [make((1, 2, n, 8), torch.bfloat16, seed=n) for n in (5, 1)]  # dynamic KV cache growth
    same(torch.cat([dev(k) for k in ks], -2), torch.cat(ks, -2))
    out = dev(torch.empty(0))
    torch.cat([dev(a), dev(a)], 0, out=out)
    same(out, torch.cat([a, a], 0))
    raises_like(lambda: torch.cat([a, make((3, 3, 4), torch.float32)], 1),
                lambda: torch.cat([dev(a), dev(make((3, 3, 4), torch.float32))], 1))
    raises_like(lambda: torch.cat([torch.tensor(1.0)]), lambda: torch.cat([dev(torch.tensor(1.0))]))
    xs = [make((3, 2), torch.float32, seed=i).requires_grad_() for i in range(3)]
    xd = [dev(x.detach()).requires_grad_() for x in xs]
    torch.cat(xs, 1).pow(2).sum().backward()
    torch.cat(xd, 1).pow(2).sum().backward()
    for x, y in zip(xs, xd):
        torch.testing.assert_close(y.grad.cpu(), x.grad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,dim", [((7, 9, 5), 0), ((7, 9, 5), 1), ((7, 9, 5), 2), ((300,), 0), ((4, 64), 1),
                                       ((4, 64), -1)])
def test_reduced_precision_accumulation_bitwise(dtype, shape, dim):
    # CPU sums half/bfloat16 scatter_add contributions in float and rounds once; index_add does the same
    # along the first or last dim of a 2+-dim tensor (alpha 1, int64 index) and rounds per slice elsewhere.
    # Rounding after every addition instead drifted by several ulps where many indices meet.
    g = torch.Generator().manual_seed(hash((shape, dim)) % 1000)
    src = torch.randn(*shape, generator=g).to(dtype)
    base = torch.randn(*shape, generator=g).to(dtype)
    idx = torch.randint(0, 3, shape, generator=g)
    n = lambda t: t.to("neuron")  # noqa: E731
    want = base.scatter_add(dim, idx, src)
    assert torch.equal(n(base).scatter_add(dim, n(idx), n(src)).cpu(), want)
    assert torch.equal(n(base).scatter_add_(dim, n(idx), n(src)).cpu(), want)
    d = dim % len(shape)
    bshape = list(shape)
    bshape[d] = 3
    base = torch.randn(*bshape, generator=g).to(dtype)
    i1 = torch.randint(0, 3, (shape[d],), generator=g)
    for index in (i1, i1.int()):
        want = base.index_add(dim, index, src)
        assert torch.equal(n(base).index_add(dim, n(index), n(src)).cpu(), want)
        # a non-contiguous self takes the same path
        nb = n(base.mT.contiguous().mT) if base.dim() > 1 else n(base)
        assert torch.equal(nb.index_add_(dim, n(index), n(src)).cpu(), want)
    # alpha != 1: CPU's loops round source * alpha in two ways; ours rounds once, within one ulp of CPU.
    got = n(base).index_add(dim, n(i1), n(src), alpha=0.7).cpu()
    torch.testing.assert_close(got, base.index_add(dim, i1, src, alpha=0.7), atol=0.02 * shape[d], rtol=0.02)
