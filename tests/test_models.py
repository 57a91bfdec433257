"""Training and inference on neuron equal CPU: an MLP, a tiny Llama, autocast, save/load."""
import copy
import io

import pytest
import torch

from torch_neuronx.testing.tiny_models import make_tiny_llama


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Dropout(0.0), torch.nn.Linear(32, 5))


def train(model, device, steps=5):
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 12, generator=g).to(device)
        y = torch.randint(0, 5, (16,), generator=g).to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def test_mlp_training_equals_cpu():
    cpu_losses, cpu_state = train(mlp(), "cpu")
    n_losses, n_state = train(mlp(), "neuron")
    torch.testing.assert_close(n_losses, cpu_losses, rtol=1e-5, atol=1e-6)
    for k in cpu_state:
        torch.testing.assert_close(n_state[k], cpu_state[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_tiny_llm_forward_backward_adamw(model_type):
    model, tok = make_tiny_llama(model_type=model_type)
    model.train()
    ids = torch.randint(5, len(tok), (2, 24), generator=torch.Generator().manual_seed(0))
    ref = copy.deepcopy(model)
    nmodel = model.to("neuron")
    results = {}
    for name, m, dev in (("cpu", ref, "cpu"), ("neuron", nmodel, "neuron")):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        out = m(input_ids=ids.to(dev), labels=ids.to(dev))
        out.loss.backward()
        grads = {k: p.grad.detach().cpu().clone() for k, p in m.named_parameters()}
        opt.step()
        logits2 = m(input_ids=ids.to(dev)).logits.detach().cpu()
        results[name] = (out.logits.detach().cpu(), out.loss.item(), grads, logits2)
    c, n = results["cpu"], results["neuron"]
    torch.testing.assert_close(n[0], c[0], rtol=1e-4, atol=1e-5)
    assert abs(n[1] - c[1]) < 1e-5
    for k in c[2]:
        torch.testing.assert_close(n[2][k], c[2][k], rtol=1e-4, atol=1e-6, msg=k)
    torch.testing.assert_close(n[3], c[3], rtol=1e-4, atol=1e-5)


def test_autocast_bf16_matmul():
    a = torch.randn(8, 16, device="neuron")
    b = torch.randn(16, 4, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y = a @ b
        lin = torch.nn.functional.linear(a, b.t())
        s = torch.softmax(y, -1)
        e = torch.exp(y)  # an fp32 op
    assert y.dtype == torch.bfloat16 and lin.dtype == torch.bfloat16
    assert e.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = a.cpu() @ b.cpu()
    torch.testing.assert_close(y.cpu(), want)
    assert s.shape == (8, 4)
    with torch.autocast("neuron", dtype=torch.float16):
        assert (a @ b).dtype == torch.float16
    assert torch.get_autocast_dtype("neuron") in (torch.bfloat16, torch.float16)


def test_save_load(tmp_path):
    t = torch.randn(5, 3).to("neuron")
    path = tmp_path / "t.pt"
    torch.save({"t": t, "view": t[1:, ::2], "state": mlp().to("neuron:1").state_dict()}, path)
    loaded = torch.load(path)
    assert loaded["t"].device == torch.device("neuron:0") and torch.equal(loaded["t"].cpu(), t.cpu())
    assert torch.equal(loaded["view"].cpu(), t[1:, ::2].cpu())
    assert all(v.device == torch.device("neuron:1") for v in loaded["state"].values())
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["t"].device.type == "cpu" and torch.equal(on_cpu["t"], t.cpu())
    m = mlp().to("neuron")
    m.load_state_dict(on_cpu["state"])
    for k, v in m.state_dict().items():
        assert v.device.type == "neuron" and torch.equal(v.cpu(), on_cpu["state"][k])
    buf = io.BytesIO()
    torch.save(t, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf, map_location="neuron:2").cpu(), t.cpu())
