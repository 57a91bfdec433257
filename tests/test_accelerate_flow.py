"""Accelerate on neuron: a plain `Accelerator(mixed_precision="bf16")` loop (tests/accelerate_worker.py) under
`accelerate launch` with 1 and 2 processes; `save_state` / `load_state` resumes to the very same losses (bit-equal:
same device, same kernels, the neuron generator's state restored, so dropout draws the same masks); reseeding the
neuron generator after `load_state` changes them (the control). `accelerate env` names the device.
With 2 processes `load_state` loads the model through `safetensors.torch.load_model(device="neuron:N")`, which
safetensors' Rust core refuses ("device neuron:0 is invalid"); torch_neuronx._safetensors_compat reads on CPU and
copies to the device.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("accelerate")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "accelerate_worker.py")
SAVE_AT = 4


def launch(tmp, nproc, mode, ckpt):
    out = tmp / f"{mode}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(nproc), "--num_machines", "1",
           "--mixed_precision", "bf16", "--dynamo_backend", "no", WORKER, mode, str(ckpt), str(out)]
    proc = subprocess.run(cmd, env=env, cwd=str(tmp), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("nproc", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_save_state_load_state_resumes_identically(nproc, tmp_path):
    ckpt = tmp_path / "ckpt"
    full = launch(tmp_path, nproc, "full", ckpt)
    assert full["device"] == ("neuron" if nproc == 1 else "neuron:0"), full
    assert full["type"] == ("DistributedType.NO" if nproc == 1 else "DistributedType.MULTI_NEURON"), full
    assert full["mp"] == "bf16"
    assert len(full["losses"]) == 8 and all(len(l) == nproc for l in full["losses"])
    assert sorted(os.listdir(ckpt)) == ["model.safetensors", "optimizer.bin"] + [
        f"random_states_{r}.pkl" for r in range(nproc)]
    resumed = launch(tmp_path, nproc, "resume", ckpt)
    assert resumed["losses"] == full["losses"][SAVE_AT:], (resumed["losses"], full["losses"])
    reseeded = launch(tmp_path, nproc, "resume_reseeded", ckpt)
    assert reseeded["losses"] != full["losses"][SAVE_AT:]


def test_accelerate_env_names_the_device():
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.accelerate_cli", "env"], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PyTorch accelerator: NEURON" in proc.stdout, proc.stdout
    assert "NEURON type: NeuronCore" in proc.stdout, proc.stdout


def test_safetensors_load_file_and_load_model_on_neuron(tmp_path):
    from safetensors.torch import load_file, load_model, save_file, save_model

    t = torch.arange(6.0).reshape(2, 3)
    save_file({"a": t}, str(tmp_path / "t.safetensors"))
    for device in ("neuron", "neuron:1", torch.device("neuron", 1)):
        got = load_file(str(tmp_path / "t.safetensors"), device=device)["a"]
        assert got.device == torch.device(device if not isinstance(device, str) or ":" in device else "neuron:0")
        assert torch.equal(got.cpu(), t)
    assert load_file(str(tmp_path / "t.safetensors"))["a"].device.type == "cpu"
    src = torch.nn.Linear(3, 2).to("neuron:1")
    save_model(src, str(tmp_path / "m.safetensors"))
    dst = torch.nn.Linear(3, 2).to("neuron:1")
    missing, unexpected = load_model(dst, str(tmp_path / "m.safetensors"), device="neuron:1")
    assert not missing and not unexpected
    assert dst.weight.device == torch.device("neuron:1") and torch.equal(dst.weight.cpu(), src.weight.cpu())
