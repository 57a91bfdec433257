"""Random numbers come from the neuron generator (Philox: seed + offset) and follow torch.neuron seeds."""
import pytest
import torch

import torch_neuronx


def draw():
    return torch.cat([torch.rand(50, device="neuron"), torch.randn(50, device="neuron"),
                      torch.randint(0, 100, (50,), device="neuron").float(),
                      torch.empty(50, device="neuron").bernoulli_(0.3),
                      torch.randperm(50, device="neuron").float()]).cpu()


def test_manual_seed_reproduces():
    torch.neuron.manual_seed(123)
    a = draw()
    torch.neuron.manual_seed(123)
    b = draw()
    torch.neuron.manual_seed(124)
    c = draw()
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(5)  # torch.manual_seed seeds the neuron generators too
    d = draw()
    torch.manual_seed(5)
    assert torch.equal(d, draw())


def test_random_ops_are_native():
    torch_neuronx.reset_op_counts()
    draw()
    counts = torch_neuronx.op_counts()
    for op in ("aten::uniform_", "aten::normal_", "aten::random_.from", "aten::bernoulli_.float",
               "aten::randperm.generator_out"):
        assert counts[op]["native"] >= 1, op
    assert not any("uniform" in op or "normal" in op for op in torch_neuronx.fallback_ops())


def test_distributions():
    torch.neuron.manual_seed(0)
    u = torch.rand(200_000, device="neuron").cpu()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    n = torch.randn(200_000, device="neuron", dtype=torch.float64).cpu()
    assert abs(n.mean()) < 0.02 and abs(n.std() - 1) < 0.02
    b = torch.empty(100_000, device="neuron").bernoulli_(0.25).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean() - 0.25) < 0.01
    r = torch.randint(-3, 4, (10_000,), device="neuron").cpu()
    assert set(r.unique().tolist()) == set(range(-3, 4))
    p = torch.randperm(1000, device="neuron").cpu()
    assert torch.equal(p.sort().values, torch.arange(1000))
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(1000, device="neuron", dtype=torch.float32).to(dtype)
        assert x.dtype == dtype and torch.isfinite(x.cpu()).all()
        y = torch.rand(1000, device="neuron", dtype=dtype).cpu()
        assert y.dtype == dtype and (y >= 0).all() and (y <= 1).all()


def test_argument_errors_match_cpu():
    with pytest.raises(RuntimeError, match=r"uniform_ expects to return a \[from, to\) range"):
        torch.empty(3, device="neuron").uniform_(2, 1)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0"):
        torch.empty(3, device="neuron").normal_(0, -1)
    with pytest.raises(RuntimeError, match=r"bernoulli_ expects p to be in \[0, 1\]"):
        torch.empty(3, device="neuron").bernoulli_(1.5)
    with pytest.raises(RuntimeError, match="random_ expects 'from' to be less than 'to'"):
        torch.empty(3, device="neuron").random_(5, 2)


def test_rng_state_layout_and_fork_rng():
    torch.neuron.manual_seed(7)
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    seed, offset = state.view(torch.int64).tolist()
    assert seed == 7 and offset == 0
    a = torch.rand(10, device="neuron")
    seed2, offset2 = torch.neuron.get_rng_state().view(torch.int64).tolist()
    assert seed2 == 7 and offset2 > 0 and offset2 % 4 == 0
    torch.neuron.set_rng_state(state)
    assert torch.equal(torch.rand(10, device="neuron").cpu(), a.cpu())
    with torch.random.fork_rng(device_type="neuron"):
        torch.rand(100, device="neuron")
    assert torch.neuron.get_rng_state().view(torch.int64).tolist() == [7, offset2]
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    torch.neuron.set_rng_state_all(states)
    assert torch.neuron.initial_seed() == 7


def test_generator_objects():
    g = torch.Generator(device="neuron").manual_seed(3)
    a = torch.rand(5, device="neuron", generator=g)
    g.manual_seed(3)
    assert torch.equal(torch.rand(5, device="neuron", generator=g).cpu(), a.cpu())
    assert g.device.type == "neuron"
    with pytest.raises(RuntimeError):
        g.set_offset(3)  # Philox offsets are multiples of 4


def test_dropout_and_long_tail_follow_neuron_seed():
    x = torch.ones(1000, device="neuron")
    outs = []
    for _ in range(2):
        torch.neuron.manual_seed(11)
        outs.append(torch.cat([torch.nn.functional.dropout(x, 0.5, training=True),
                               torch.empty(100, device="neuron").exponential_(),
                               torch.multinomial(torch.ones(10, device="neuron"), 5).float()]).cpu())
    assert torch.equal(outs[0], outs[1])
    kept = outs[0][:1000]
    assert set(kept.unique().tolist()) <= {0.0, 2.0} and 0.4 < (kept > 0).float().mean() < 0.6


def test_exponential_and_multinomial_native():
    torch.neuron.manual_seed(3)
    torch_neuronx.reset_op_counts()
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        e = torch.empty(100_000, device="neuron", dtype=dtype).exponential_(2.0).cpu().double()
        assert (e >= 0).all() and torch.isfinite(e).all() and abs(e.mean() - 0.5) < 0.02
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [5.0, 1.0, 0.0, 4.0]], device="neuron")
    draws = torch.multinomial(probs.repeat(2000, 1), 1).view(2000, 2).cpu()
    for row, p in enumerate(probs.cpu()):
        freq = torch.bincount(draws[:, row], minlength=4).double() / 2000
        assert freq[p == 0].sum() == 0
        assert torch.allclose(freq, (p / p.sum()).double(), atol=0.04), (row, freq)
    s = torch.multinomial(probs, 3).cpu()  # without replacement: distinct, zero-probability last
    assert s.shape == (2, 3) and all(len(set(r.tolist())) == 3 for r in s)
    counts = torch_neuronx.op_counts()
    for op in ("aten::exponential_", "aten::multinomial"):
        assert counts[op]["native"] >= 1 and counts[op]["fallback"] == 0, op
    # What the sampling itself runs is native (probs.repeat above views through unfold, a fallback).
    assert set(torch_neuronx.fallback_ops()) <= {"aten::unfold"}, torch_neuronx.fallback_ops()
    # With replacement and several samples: the CPU kernel, still from the neuron seed.
    a = [torch.multinomial(torch.ones(6, device="neuron"), 4, replacement=True) for _ in range(1)]
    assert a[0].device.type == "neuron" and a[0].shape == (4,)
    for bad in (torch.tensor([0.5, float("nan")]), torch.tensor([0.0, 0.0]), torch.tensor([-1.0, 2.0]),
                torch.tensor([1, 2]), torch.ones(2, 2, 2)):
        with pytest.raises(RuntimeError) as e_cpu:
            torch.multinomial(bad, 1)
        with pytest.raises(RuntimeError) as e_dev:
            torch.multinomial(bad.to("neuron"), 1)
        assert str(e_cpu.value) == str(e_dev.value)
    with pytest.raises(RuntimeError) as e_cpu:
        torch.multinomial(torch.ones(3), 4)
    with pytest.raises(RuntimeError) as e_dev:
        torch.multinomial(torch.ones(3, device="neuron"), 4)
    assert str(e_cpu.value) == str(e_dev.value)
    with pytest.raises(RuntimeError, match="exponential_ expects lambda > 0.0"):
        torch.empty(3, device="neuron").exponential_(0)
