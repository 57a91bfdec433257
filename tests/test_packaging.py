"""Installs the package into a fresh virtual environment holding only torch 2.13.0 and uses it from outside the
source tree: a tensor op, a compiled function and neuron-ls. Slow (a venv, torch, a wheel): RUN_SLOW=1."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
slow = pytest.mark.slow

USE = """
import torch, torch_neuronx
assert torch_neuronx.__file__.startswith(%r), torch_neuronx.__file__
x = torch.arange(6.0, device="neuron").reshape(2, 3)
assert (x + 1).sum().item() == 21.0
f = torch.compile(lambda a: torch.relu(a - 2) * 3, backend="neuron")
assert f(x).cpu().tolist() == [[0.0, 0.0, 0.0], [3.0, 6.0, 9.0]]
import importlib.util
assert importlib.util.find_spec("nki") is not None  # shipped; it needs numpy (the [nki] extra) to import
print("ok")
"""


def _run(cmd, cwd, env=None, timeout=1800):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _fresh_venv(path, extra=()):
    _run([sys.executable, "-m", "venv", str(path)], cwd=str(path.parent))
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run(pip + ["torch==2.13.0", *extra], cwd=str(path.parent))
    return path / "bin"


def _use(bindir, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bindir}:{env.get('PATH', '')}"
    site = _run([str(bindir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=str(tmp_path), env=env).stdout.strip()
    assert _run([str(bindir / "python"), "-c", USE % site], cwd=str(tmp_path), env=env).stdout.strip() == "ok"
    data = json.loads(_run([str(bindir / "neuron-ls"), "--json"], cwd=str(tmp_path), env=env).stdout)
    assert data["versions"]["torch-neuronx"] == "0.1.0" and len(data["cores"]) == 4
    assert _run([str(bindir / "python"), "-m", "torch_neuronx", "check"], cwd=str(tmp_path), env=env)


@slow
def test_wheel_into_fresh_venv(tmp_path):
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(wheels), REPO],
         cwd=REPO)
    (wheel,) = wheels.glob("torch_neuronx-*.whl")
    bindir = _fresh_venv(tmp_path / "venv")
    _run([str(bindir / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], cwd=str(tmp_path))
    _use(bindir, tmp_path)


@slow
def test_pip_install_non_editable_into_fresh_venv(tmp_path):
    # Without build isolation the environment supplies the build requirements (pyproject [build-system]).
    bindir = _fresh_venv(tmp_path / "venv", extra=("setuptools>=64", "wheel", "cmake>=3.22"))
    env = dict(os.environ, NEURON_CMAKE_BUILD_DIR=str(tmp_path / "cmake-build"),
               PATH=f"{bindir}:{os.environ.get('PATH', '')}")
    _run([str(bindir / "python"), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", REPO],
         cwd=str(tmp_path), env=env, timeout=3600)
    _use(bindir, tmp_path)
