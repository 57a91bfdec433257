"""Memory statistics of the neuron caching allocator (the same keys as ``torch.cuda.memory_stats``)."""

from collections import OrderedDict
from typing import Any, Tuple

import torch

from .. import _C


def _index(device) -> int:
    from . import _device_index, _lazy_init

    _lazy_init()
    idx = _device_index(device)
    _C._check_device(idx)
    return idx


def empty_cache() -> None:
    """Return cached, unused device memory segments (memory_reserved drops; allocated is unchanged)."""
    from . import _lazy_init

    _lazy_init()
    torch.accelerator.memory.empty_cache()


def memory_stats(device=None) -> "OrderedDict[str, Any]":
    return torch.accelerator.memory.memory_stats(_index(device))


def memory_allocated(device=None) -> int:
    return torch.accelerator.memory.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.memory.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    return torch.accelerator.memory.memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
    return torch.accelerator.memory.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.memory.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.memory.reset_accumulated_memory_stats(_index(device))


def mem_get_info(device=None) -> Tuple[int, int]:
    """(free, total) bytes of the device: free = capacity - reserved."""
    return torch.accelerator.memory.get_memory_info(_index(device))


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Cap this process's device memory at ``fraction`` of the device's capacity."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    idx = _index(device)
    total = _C._get_device_properties(idx)["total_memory"]
    _C._set_memory_capacity(idx, int(total * fraction))
