"""TorchNeuron: the ``neuron`` device for PyTorch.

``import torch`` loads this package through the ``torch.backends`` entry point (set
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` to disable that); ``import torch_neuronx`` loads it explicitly.
Afterwards ``torch.device("neuron")``, ``tensor.to("neuron")``, ``torch.neuron`` and
``torch.accelerator`` work as they do for other PyTorch devices.
"""

import threading

import torch

__version__ = "0.1.0"

_lock = threading.Lock()
_loaded = False


def _load() -> None:
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
        from . import neuron as _device_module

        torch._register_device_module("neuron", _device_module)
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
        _loaded = True


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group, called by ``import torch``."""
    _load()


_load()

from ._ops import op_counts, reset_op_counts, fallback_ops  # noqa: E402

__all__ = ["op_counts", "reset_op_counts", "fallback_ops", "__version__"]
