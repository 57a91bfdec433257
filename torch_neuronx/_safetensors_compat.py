"""``safetensors.torch.load_file(path, device="neuron:N")`` (and ``load_model``, which calls it) for neuron.

safetensors' Rust core parses the device itself and knows a fixed list (cpu, cuda, mps, npu, xpu, xla, mlu, musa,
hpu): ``device="neuron:0"`` raises ``SafetensorError: device neuron:0 is invalid`` (custom devices are unreleased
pull requests there). Accelerate's ``load_state`` with several processes loads the model with
``safetensors.torch.load_model(model, file, device=str(accelerator.device))``, so resuming a multi-process neuron run
failed. For a neuron device the file is read on CPU and each tensor copied to the device once, which is what the
Rust core does for the devices it knows. Any other device goes to safetensors unchanged.

``install()`` patches ``safetensors.torch`` now if it is loaded, else right after it loads (a one-shot import hook,
as for Dynamo's device interface). A script whose first import is ``safetensors.torch`` (which imports torch, and
so torch_neuronx, before it defines ``load_file``) keeps the original; Transformers and Accelerate import torch first.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys

import torch

_MODULE = "safetensors.torch"


def _neuron_device(device):
    if isinstance(device, torch.device):
        return device if device.type == "neuron" else None
    if isinstance(device, str) and device.split(":", 1)[0] == "neuron":
        return torch.device(device)
    return None


def _patch(module) -> None:
    load_file = getattr(module, "load_file", None)
    if load_file is None or getattr(load_file, "_neuron_compat", False):
        return

    @functools.wraps(load_file)
    def neuron_load_file(filename, device="cpu", *args, **kwargs):
        target = _neuron_device(device)
        if target is None:
            return load_file(filename, device, *args, **kwargs)
        return {k: v.to(target) for k, v in load_file(filename, "cpu", *args, **kwargs).items()}

    neuron_load_file._neuron_compat = True
    module.load_file = neuron_load_file


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of safetensors.torch once, then steps aside."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    module = sys.modules.get(_MODULE)
    if module is not None:
        _patch(module)  # no-op while it is still executing (it imports torch first): then load_file is not there yet
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
