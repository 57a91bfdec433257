"""Faults and load: allocations failing under fault injection give clean OutOfMemoryErrors with consistent
statistics and the next step works; many generate calls return memory to its baseline; two threads running
two models (on two cores, and on one) give what sequential runs give."""
import threading

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.testing.tiny_models import make_tiny_llama

FAULT_SCRIPT = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 64, device="neuron"), torch.randn(32, 8, device="neuron")
model(x).sum().backward(); opt.step(); opt.zero_grad(set_to_none=True)  # grads and state exist from here on
baseline = torch.neuron.memory_allocated()
ooms = ok = 0
for step in range(60):
    try:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ok += 1
    except torch.OutOfMemoryError as e:
        assert "fault injection" in str(e), e
        ooms += 1
        opt.zero_grad(set_to_none=True)
    loss = None
    s = torch.neuron.memory_stats()
    assert torch.neuron.memory_allocated() == baseline, (step, torch.neuron.memory_allocated(), baseline)
    assert s["allocated_bytes.all.current"] <= s["reserved_bytes.all.current"]
    assert s["allocation.all.current"] >= 0 and s["active_bytes.all.current"] == s["allocated_bytes.all.current"]
print("OK", ooms, ok, torch.neuron.memory_stats()["num_ooms"])
"""


def test_fault_injected_allocations_fail_cleanly(python):
    r = python(FAULT_SCRIPT, env={"NEURON_RT_FAULT_ALLOC_EVERY": "23"})
    assert r.returncode == 0, r.stderr[-3000:]
    _, ooms, ok, num_ooms = r.stdout.split()
    assert int(ooms) > 0 and int(ok) > 0 and int(num_ooms) >= int(ooms), r.stdout


@pytest.fixture(scope="module")
def tiny():
    model, tok = make_tiny_llama()
    return model.eval(), tok


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_many_generate_calls_return_memory(tiny, cache):
    model, tok = tiny
    m = model.to("neuron")
    ids = tok("hello world", return_tensors="pt").input_ids.to("neuron")
    kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    if cache == "static":
        kw.update(cache_implementation="static", disable_compile=True)
    m.generate(ids, **kw)  # warm: lazily created buffers, the cache's first shapes
    torch.neuron.synchronize()
    base_alloc = torch.neuron.memory_allocated()
    base_reserved = torch.neuron.memory_reserved()
    first = m.generate(ids, **kw)
    for _ in range(1000 if cache == "dynamic" else 300):
        out = m.generate(ids, **kw)
    assert torch.equal(out, first)
    del out, first
    assert torch.neuron.memory_allocated() == base_alloc
    assert torch.neuron.memory_reserved() <= base_reserved + (4 << 20)  # the cache settles, it does not grow


@pytest.mark.parametrize("cores", [2, 1])
def test_two_threads_two_models(cores):
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.SiLU(), torch.nn.Linear(96, 48)) for _ in range(2)]
    inputs = [torch.randn(16, 48) for _ in range(2)]
    devices = [torch.device("neuron", i % cores) for i in range(2)]
    placed = [m.to(d) for m, d in zip(models, devices)]

    def run(i, out):
        with torch.neuron.device(devices[i]):
            x = inputs[i].to(devices[i])
            for _ in range(50):
                x = torch.tanh(placed[i](x))
            out[i] = x.cpu()

    sequential = [None, None]
    for i in range(2):
        run(i, sequential)
    threaded = [None, None]
    threads = [threading.Thread(target=run, args=(i, threaded)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s, t in zip(sequential, threaded):
        torch.testing.assert_close(t, s, rtol=0, atol=0)


CACHE_SCRIPT = """
import torch, torch_neuronx
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.LayerNorm(96), torch.nn.Linear(96, 5))
x = torch.randn(7, 48)
want = model(x)
dev = model.to("neuron")
fn = torch.compile(lambda t: dev(t).softmax(-1), backend="neuron", fullgraph=True, dynamic=False)
got = fn(x.to("neuron")).cpu()
torch.testing.assert_close(got, want.softmax(-1), rtol=1e-5, atol=1e-6)
print("OK", [g["cache"] for g in torch_neuronx.compiler.stats()["graphs"]])
"""


@pytest.mark.slow
def test_two_processes_compile_into_one_cache(tmp_path):
    """Two processes compile the same graph into one empty cache directory at the same moment: both results are
    right, and a third process then reads the cache they wrote (a hit) and is right too."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCH_NEURONX_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", CACHE_SCRIPT]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0 and "OK" in out, out[-4000:]
    third = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    out = third.stdout + third.stderr
    assert third.returncode == 0 and "OK" in out, out[-4000:]
    assert "hit" in out.split("OK", 1)[1], out[-4000:]
