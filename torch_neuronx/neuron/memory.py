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


# --------------------------------------------------------------------------------------------------
# Summary and snapshots (the formats of torch.cuda.memory_summary and torch.cuda.memory._snapshot)


def _format_bytes(n: int) -> str:
    for unit in ("B  ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 * 10 or unit == "TiB":
            return f"{n:6d} {unit}"
        n //= 1024
    return f"{n} TiB"


def _format_count(n: int) -> str:
    for unit in (" ", "K", "M"):
        if abs(n) < 1000 * 10 or unit == "M":
            return f"{n:7d}{unit} "
        n //= 1000
    return f"{n}"


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of the allocator's statistics for ``device``, laid out as ``torch.cuda.memory_summary``."""
    stats = memory_stats(device)
    idx = _index(device)
    rows = [
        ("allocated_bytes", "Allocated memory", _format_bytes),
        ("active_bytes", "Active memory", _format_bytes),
        ("requested_bytes", "Requested memory", _format_bytes),
        ("reserved_bytes", "Device reserved memory", _format_bytes),
        ("inactive_split_bytes", "Non-releasable memory", _format_bytes),
        ("allocation", "Allocations", _format_count),
        ("active", "Active allocs", _format_count),
        ("segment", "Device reserved segments", _format_count),
        ("inactive_split", "Non-releasable allocs", _format_count),
    ]
    width = 75
    line = "|" + "=" * width + "|"
    thin = "|" + "-" * width + "|"
    out = [line, "|{:^75}|".format(f"PyTorch neuron memory summary, device ID {idx}"), thin,
           "|  neuron OOMs: {:<13d}|  allocation retries: {:<35d}|".format(stats.get("num_ooms", 0),
                                                                            stats.get("num_alloc_retries", 0)),
           line, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |", thin]
    pools = [("all", "")] if abbreviated else [("all", ""), ("large_pool", "      from large pool"),
                                                ("small_pool", "      from small pool")]
    for key, name, fmt in rows:
        out.append(thin)
        for pool, label in pools:
            vals = [stats.get(f"{key}.{pool}.{s}", 0) for s in ("current", "peak", "allocated", "freed")]
            out.append("| {:<21} | {} | {} | {} | {} |".format(label or name, *[fmt(v) for v in vals]))
    out.append(line)
    for key, name in (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize device segments")):
        vals = [stats.get(f"{key}.{s}", 0) for s in ("current", "peak", "allocated", "freed")]
        out.append("| {:<21} | {} | {} | {} | {} |".format(name, *[_format_count(v) for v in vals]))
    out.append(line)
    return "\n".join(out) + "\n"


def _record_memory_history(enabled="all", context="all", stacks="python", max_entries: int = 2 ** 62,
                           device=None, **kwargs) -> None:
    """Start (``enabled="all"`` or ``"state"``) or stop (``None``) recording allocations with their stacks.

    As ``torch.cuda.memory._record_memory_history``: while recording, each allocation and free of every
    neuron device is kept (up to ``max_entries`` events, oldest dropped) with the Python stack that made it
    (``stacks="python"`` or ``"all"``; ``context=None`` records none). ``_snapshot()`` returns them."""
    if enabled not in (None, False, True, "all", "state"):
        raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    if context not in (None, "all", "alloc", "state"):
        raise ValueError(f"context must be None, 'alloc', 'state' or 'all', got {context!r}")
    from . import _lazy_init

    _lazy_init()
    on = enabled not in (None, False)
    entries = 0 if enabled == "state" else int(max_entries)
    _C._record_memory_history(on, on and context is not None, entries)


def _snapshot(device=None) -> dict:
    """The allocator's segments and blocks, and the recorded events, as ``torch.cuda.memory._snapshot()``:
    ``{"segments": [...], "device_traces": [[...] per device]}``. ``torch.cuda._memory_viz`` renders it
    (``trace_plot``, ``segment_plot``), as does https://pytorch.org/memory_viz after ``_dump_snapshot``."""
    from . import _lazy_init

    _lazy_init()
    return _C._memory_snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles ``_snapshot()`` to ``filename`` (the file pytorch.org/memory_viz opens)."""
    import pickle

    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)
