"""Tensors on neuron behave like CPU tensors: creation, views, in-place ops, broadcasting, casts, copies."""
import pytest
import torch

import torch_neuronx

ALL_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.uint16, torch.uint32, torch.uint64,
              torch.complex64, torch.complex128]
REAL_DTYPES = [d for d in ALL_DTYPES if not d.is_complex]


def sample(dtype, shape=(3, 5, 7), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 10).to(dtype)
    lo = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -100
    return torch.randint(lo, 100, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_roundtrip(dtype):
    x = sample(dtype)
    n = x.to("neuron")
    assert n.device.type == "neuron" and n.dtype == dtype and n.shape == x.shape
    assert torch.equal(n.cpu(), x)


@pytest.mark.parametrize("src", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("dst", ALL_DTYPES, ids=str)
def test_cast_matches_cpu(src, dst):
    if src.is_complex and not dst.is_complex:
        pytest.skip("complex -> real discards the imaginary part with a warning on CPU too")
    x = sample(src)
    want = x.to(dst)
    got = x.to("neuron").to(dst)
    assert got.dtype == dst
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
    # host -> device with a cast in the same copy
    torch.testing.assert_close(x.to("neuron", dst).cpu(), want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_special_values_cast(dtype):
    x = torch.tensor([0.0, -0.0, 1.5, 2.5, -2.5, 65504.0, 1e-8, 3.0e38, float("inf"), -float("inf"),
                      float("nan"), 0.1, 1 / 3])
    if not dtype.is_floating_point:
        x = x[:8]
    torch.testing.assert_close(x.to("neuron").to(dtype).cpu(), x.to(dtype), rtol=0, atol=0, equal_nan=True)


def test_non_contiguous_copies():
    x = torch.randn(6, 8, 5)
    n = x.to("neuron")
    for view in (lambda t: t.transpose(0, 2), lambda t: t[:, ::2, 1:], lambda t: t.permute(2, 0, 1)[1:, :, ::3],
                 lambda t: t.flip(0), lambda t: t[2], lambda t: t.expand(2, 6, 8, 5)):
        want = view(x)
        got = view(n)
        assert got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got.cpu(), want)
        assert torch.equal(got.contiguous().cpu(), want.contiguous())
        # CPU non-contiguous -> neuron
        assert torch.equal(want.to("neuron").cpu(), want)
    # copy_ into a non-contiguous neuron destination, with broadcasting and a cast
    d = torch.zeros(8, 6, device="neuron", dtype=torch.float64).t()
    d.copy_(torch.arange(6.0).view(6, 1))
    assert torch.equal(d.cpu(), torch.arange(6.0, dtype=torch.float64).view(6, 1).expand(6, 8))


def test_zero_size_and_scalars():
    e = torch.empty(0, 3, device="neuron")
    assert e.shape == (0, 3) and e.cpu().shape == (0, 3)
    assert e.sum().item() == 0
    s = torch.tensor(3.5, device="neuron")
    assert s.dim() == 0 and s.item() == 3.5
    assert torch.zeros(0, device="neuron").to(torch.int64).numel() == 0


def test_views_share_memory():
    a = torch.zeros(4, 6, device="neuron")
    v = a[1:3, ::2]
    v.fill_(5)
    a.view(-1)[0] = 7
    t = a.t()
    t[5, 3] = 9
    want = torch.zeros(4, 6)
    want[1:3, ::2] = 5
    want.view(-1)[0] = 7
    want.t()[5, 3] = 9
    assert torch.equal(a.cpu(), want)
    assert v._base is a and t._base is a
    u = a.unfold(1, 2, 2)  # a view op that runs through the fallback
    assert u.data_ptr() == a.data_ptr() and torch.equal(u.cpu(), want.unfold(1, 2, 2))
    parts = a.split(2, dim=1)
    parts[1].zero_()
    want.split(2, dim=1)[1].zero_()
    assert torch.equal(a.cpu(), want)


def test_inplace_and_broadcast():
    x = torch.randn(5, 1, 3)
    y = torch.randn(4, 1)
    nx, ny = x.to("neuron"), y.to("neuron")
    torch.testing.assert_close((nx + ny).cpu(), x + y)
    torch.testing.assert_close((nx * ny - nx / 2).cpu(), x * y - x / 2)
    a, na = torch.randn(4, 3), torch.randn(4, 3)
    na = a.to("neuron")
    na.mul_(2).add_(torch.ones(3, device="neuron")).clamp_(min=0)
    a.mul_(2).add_(torch.ones(3)).clamp_(min=0)
    torch.testing.assert_close(na.cpu(), a)
    # a CPU scalar tensor mixes with neuron tensors, as with CUDA
    torch.testing.assert_close((na * torch.tensor(3.0)).cpu(), a * 3)
    # an out= argument of the wrong size is resized, as on CPU
    out = torch.empty(0, device="neuron")
    torch.add(na, na, out=out)
    assert out.shape == (4, 3)
    torch.testing.assert_close(out.cpu(), a + a)


def test_fill_and_factories():
    for dtype in REAL_DTYPES:
        f = torch.full((3, 4), 7, dtype=dtype, device="neuron")
        assert torch.equal(f.cpu(), torch.full((3, 4), 7, dtype=dtype))
        z = torch.zeros(5, dtype=dtype, device="neuron")
        assert torch.equal(z.cpu(), torch.zeros(5, dtype=dtype))
    t = torch.empty(4, 4, device="neuron")[:, 1].fill_(2.5)
    assert torch.equal(t.cpu(), torch.full((4,), 2.5))
    with pytest.raises(RuntimeError, match="overflow"):
        torch.empty(3, dtype=torch.uint8, device="neuron").fill_(300)
    torch.testing.assert_close(torch.linspace(0, 1, 7, device="neuron").cpu(), torch.linspace(0, 1, 7))
    assert torch.equal(torch.eye(3, device="neuron").cpu(), torch.eye(3))
    assert torch.equal(torch.arange(2, 20, 3, device="neuron").cpu(), torch.arange(2, 20, 3))


def test_indexing_and_reductions():
    x = torch.randn(6, 5)
    n = x.to("neuron")
    idx = torch.tensor([4, 0, 2])
    assert torch.equal(n[idx.to("neuron")].cpu(), x[idx])
    assert torch.equal(n[idx].cpu(), x[idx])  # CPU indices are accepted, as on CUDA
    assert torch.equal(n[n > 0].cpu(), x[x > 0])
    torch.testing.assert_close(n.softmax(-1).cpu(), x.softmax(-1))
    vals, inds = n.max(dim=1)
    assert torch.equal(vals.cpu(), x.max(dim=1).values) and inds.device.type == "neuron"
    assert n.argmax().item() == x.argmax().item()
    assert torch.equal(torch.nonzero(n > 0).cpu(), torch.nonzero(x > 0))


def test_resize_and_set():
    a = torch.arange(6.0, device="neuron")
    a.resize_(2, 3)
    assert torch.equal(a.cpu(), torch.arange(6.0).view(2, 3))
    a.resize_(4, 4)
    assert a.shape == (4, 4) and torch.equal(a.view(-1)[:6].cpu(), torch.arange(6.0))
    b = torch.empty(0, device="neuron")
    b.set_(a)
    assert b.data_ptr() == a.data_ptr() and b.shape == a.shape
    c = torch.empty(0, device="neuron").set_(a.untyped_storage(), 4, (3,), (1,))
    assert c.shape == (3,) and torch.equal(c[:2].cpu(), torch.tensor([4.0, 5.0]))
    s = a.untyped_storage()
    s.resize_(1024)
    assert s.nbytes() == 1024 and s.device.type == "neuron"


def test_data_assignment_across_devices():
    p = torch.nn.Parameter(torch.randn(3, 4))
    want = p.detach().clone()
    p.data = p.data.to("neuron")
    assert p.device.type == "neuron" and isinstance(p, torch.nn.Parameter)
    assert torch.equal(p.detach().cpu(), want)
    p.data = p.data.cpu()
    assert p.device.type == "cpu" and torch.equal(p.detach(), want)
    assert torch._has_compatible_shallow_copy_type(torch.ones(1), torch.ones(1, device="neuron"))


def test_module_to_round_trip_keeps_parameters():
    m = torch.nn.Linear(4, 3)
    w = m.weight
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m.to("neuron")
    assert m.weight is w and m.weight.device.type == "neuron"  # same Parameter object (uses .data =)
    m(torch.randn(2, 4, device="neuron")).sum().backward()
    opt.step()
    m.to("cpu")
    assert m.weight is w and m.weight.device.type == "cpu"
    m.to("neuron", dtype=torch.bfloat16)
    assert m.weight.dtype == torch.bfloat16 and m.weight.device.type == "neuron"


def test_op_counters_and_disabled_fallback(python):
    torch_neuronx.reset_op_counts()
    a = torch.ones(3, device="neuron")
    torch.atan2(a, a).cpu()
    counts = torch_neuronx.op_counts()
    assert counts["aten::empty.memory_format"]["native"] >= 1
    # structured ops reach the fallback through their out= variant, with the output already on neuron
    # (atan2 has no native kernel)
    assert counts["aten::atan2.out"]["fallback"] == 1
    assert "aten::atan2.out" in torch_neuronx.fallback_ops()
    r = python("import torch\na = torch.ones(3, device='neuron')\nb = (a + a).cpu()\nprint('native ok')\n"
               "torch.atan2(a, a)", env={"TORCH_NEURONX_DISABLE_FALLBACK": "1"})
    assert "native ok" in r.stdout and r.returncode != 0
    assert "aten::atan2.out" in r.stderr and "TORCH_NEURONX_DISABLE_FALLBACK" in r.stderr


def test_pinned_memory():
    x = torch.randn(16).pin_memory()
    assert x.is_pinned()
    y = x.to("neuron", non_blocking=True)
    assert torch.equal(y.cpu(), x)
    assert not torch.randn(4).is_pinned()
