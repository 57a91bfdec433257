"""``safetensors.torch.load_file(path, device="neuron:N")`` (and ``load_model``, which calls it) for neuron.

safetensors' Rust core parses the device itself and knows a fixed list (cpu, cuda, mps, npu, xpu, xla, mlu, musa,
hpu): ``device="neuron:0"`` raises ``SafetensorError: device neuron:0 is invalid`` (custom devices are unreleased
pull requests there). Accelerate's ``load_state`` with several processes loads the model with
``safetensors.torch.load_model(model, file, device=str(accelerator.device))``, so resuming a multi-process neuron run
failed. For a neuron device the file is read on CPU and each tensor copied to the device once, which is what the
Rust core does for the devices it knows. Any other device goes to safetensors unchanged.

``install()`` patches ``safetensors.torch`` now if it is loaded, else once it loads (``_post_import``).
"""

from __future__ import annotations

import functools

import torch

from . import _post_import

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


def install() -> None:
    _post_import.when_loaded(_MODULE, "load_file", _patch)
