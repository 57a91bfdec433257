"""Random ops under activation checkpointing, eager and compiled, on neuron.

- Eager `torch.utils.checkpoint` restores the neuron generator before the recompute (it consults the
  device module's `_initialized`), so a checkpointed dropout's gradient is the plain one.
- Compiled checkpointed regions wrap random ops (dropout, SDPA, which is tagged nondeterministic even at
  dropout 0) in `run_and_save_rng_state` / `run_with_rng_state`; on neuron these save and replay the neuron
  generator, and the `neuron` backend draws random numbers from it, so compiled equals eager.
"""
import pytest
import torch
import torch.nn.functional as F
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
from torch.utils.checkpoint import checkpoint

import torch_neuronx  # noqa: F401


def dropout_block(x):
    return F.dropout(x * 2, 0.5)


def sdpa_block(x):
    h = x.view(1, x.shape[0], 2, x.shape[1] // 2).transpose(1, 2)
    return F.scaled_dot_product_attention(h * 2, h, h, dropout_p=0.3, is_causal=True)


@pytest.mark.parametrize("block", [dropout_block, sdpa_block], ids=["dropout", "sdpa"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_eager_checkpoint_replays_the_neuron_generator(block, reentrant):
    x = torch.randn(8, 16, device="neuron", requires_grad=True)
    torch.manual_seed(0)
    block(x).sum().backward()
    plain, x.grad = x.grad.clone(), None
    torch.manual_seed(0)
    checkpoint(block, x, use_reentrant=reentrant).sum().backward()
    assert plain.abs().sum() > 0
    torch.testing.assert_close(x.grad, plain, rtol=0, atol=0)


def test_rng_prims_on_neuron_tensors():
    x = torch.ones(256, device="neuron")
    state, a = run_and_save_rng_state(torch.ops.aten.bernoulli.p, x, 0.5)
    assert state.device.type == "cpu" and a.device.type == "neuron"
    b = run_and_save_rng_state(torch.ops.aten.bernoulli.p, x, 0.5)[1]
    assert not torch.equal(a, b)  # the generator advanced
    after = torch.neuron.get_rng_state()
    c = run_with_rng_state(state, torch.ops.aten.bernoulli.p, x, 0.5)
    torch.testing.assert_close(c, a, rtol=0, atol=0)
    assert torch.equal(torch.neuron.get_rng_state(), after)  # replaying leaves the generator where it was


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_compiled_checkpointed_attention_with_dropout_equals_eager(p):
    torch._dynamo.reset()
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16).to("neuron")

    def block(x):
        h = F.dropout(lin(x), p=p, training=True).view(1, 8, 2, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(h, h, h, dropout_p=p, is_causal=True)

    def step(x):
        return checkpoint(block, x, use_reentrant=False).sum()

    x = torch.randn(8, 16, device="neuron", requires_grad=True)
    results = []
    for fn in (step, torch.compile(step, backend="neuron", fullgraph=True)):
        torch.neuron.manual_seed(0)
        loss = fn(x)
        loss.backward()
        results.append((loss.detach(), x.grad.clone(), lin.weight.grad.clone()))
        x.grad, lin.weight.grad, lin.bias.grad = None, None, None
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
