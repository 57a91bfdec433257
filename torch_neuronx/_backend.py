"""Registers the neuron device with PyTorch (once per process)."""

import threading

import torch

_lock = threading.Lock()
_loaded = False


def load() -> None:
    global _loaded
    with _lock:
        if _loaded:
            return
        # Importing the extension registers the allocator, device guard, hooks and kernels.
        from . import _C

        # A bad environment (e.g. NEURON_RT_VISIBLE_CORES) must fail here, loudly, not at first use.
        _C._init()
        if torch._C._get_privateuse1_backend_name() != "neuron":
            torch.utils.rename_privateuse1_backend("neuron")
        from . import neuron as device_module

        torch._register_device_module("neuron", device_module)
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
        from .distributed import register as register_distributed

        register_distributed()
        _loaded = True
