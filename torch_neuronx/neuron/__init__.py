"""``torch.neuron``: device management, streams, events, random state and memory of NeuronCores.

Mirrors ``torch.cuda`` where PyTorch and the Hugging Face libraries expect it to.
"""

import os
from dataclasses import dataclass
from typing import Any, List, Optional, Union

import torch

from .. import _C, _post_import
from .memory import (  # noqa: F401
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from .random import (  # noqa: F401
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream  # noqa: F401

_device_t = Union[torch.device, str, int, None]

_in_bad_fork = False


def _after_fork_in_child() -> None:
    # Device memory is a shared mapping: a forked child would write into its parent's tensors.
    global _in_bad_fork
    if _C._is_initialized():
        _in_bad_fork = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def _is_in_bad_fork() -> bool:
    return _in_bad_fork


def _check_not_forked() -> None:
    if _in_bad_fork:
        raise RuntimeError(
            "Cannot use the neuron device in a forked subprocess. To use neuron with multiprocessing, "
            "use the 'spawn' start method"
        )


_init_done = False


def _lazy_init() -> None:
    # _C._init() is idempotent but a binding call; after it succeeded once only the fork check remains
    # (torch.neuron.device in every compiled graph call goes through here).
    global _init_done
    _check_not_forked()
    if not _init_done:
        _C._init()
        _init_done = True


def _device_index(device: _device_t, optional: bool = True) -> int:
    """The index of ``device`` (an int, a string like "neuron:1", a torch.device or None)."""
    if device is None:
        if not optional:
            raise ValueError("Expected a neuron device, got None")
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got: {device}")
        return current_device() if device.index is None else device.index
    if isinstance(device, int):
        return device
    raise ValueError(f"Invalid device {device!r}: expected an int, a string or a torch.device")


def _launcher_rank() -> Optional[tuple]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) when a launcher (torchrun, accelerate launch) started this process."""
    try:
        rank = int(os.environ["LOCAL_RANK"])
        size = int(os.environ.get("LOCAL_WORLD_SIZE", rank + 1))
    except (KeyError, ValueError):
        return None
    return (rank, size) if 0 <= rank < size else None


def _binding_error() -> Optional[str]:
    """Why this launcher-started process has no core of its own (None when it has one, or no launcher)."""
    launched = _launcher_rank()
    if launched is None or _own_core_from_env():
        return None
    rank, size = launched
    count = _C._device_count()
    if size <= count:
        return None
    return (f"{size} processes on this host (LOCAL_WORLD_SIZE) but {count} NeuronCores are visible "
            f"({_core_settings()}), and each process computes on a core of its own. Start at most {count} "
            f"processes per host, or make more cores visible (this process: LOCAL_RANK {rank})")


def _core_settings() -> str:
    names = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_NUM_CHIPS")
    set_ = [f"{n}={os.environ[n]}" for n in names if os.environ.get(n)]
    return ", ".join(set_) if set_ else "the defaults: 4 logical cores on 1 chip"


def _own_core_from_env() -> bool:
    """A launcher that gives each process one core through NEURON_RT_VISIBLE_CORES (one visible core)."""
    return bool(os.environ.get("NEURON_RT_VISIBLE_CORES")) and _C._device_count() == 1


def _bind_to_launcher_rank() -> None:
    """Makes neuron:LOCAL_RANK this process's current device when a launcher started it.

    On Trainium each process of a torchrun job runs on its own NeuronCore without the script asking, and
    Transformers' tensor-parallel loading places each rank's shards on neuron:LOCAL_RANK while Accelerate
    and TRL compute on torch.neuron.current_device(): the two agree only when the process is bound. An
    explicit torch.neuron.set_device later wins. A process given one core through NEURON_RT_VISIBLE_CORES
    computes on it (neuron:0). With more processes than cores the device stays neuron:0 and the neuron
    process group refuses to start, on every rank, naming the counts (_binding_error)."""
    launched = _launcher_rank()
    if launched is None or _C._device_count() == 0 or _own_core_from_env():
        return
    rank, _ = launched
    if _binding_error() is None and rank < _C._device_count():
        _C._set_device(rank)


def is_available() -> bool:
    if _post_import._pending:  # libraries that probe the device patch late if caught mid-import (_post_import)
        _post_import.flush()
    return not _in_bad_fork and _C._device_count() > 0


def is_initialized() -> bool:
    return _C._is_initialized() and not _in_bad_fork


def init() -> None:
    _lazy_init()


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    _lazy_init()
    return _C._get_device()


def set_device(device: _device_t) -> None:
    _lazy_init()
    idx = _device_index(device)
    if idx >= 0:
        _C._set_device(idx)


class device:
    """Context manager that changes the current neuron device."""

    def __init__(self, device: _device_t):
        # An int first: compiled graphs enter device(index) on every call.
        self.idx = device if type(device) is int else -1 if device is None else _device_index(device)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            _lazy_init()
            self.prev_idx = _C._get_device()
            if self.prev_idx != self.idx:
                _C._set_device(self.idx)
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self.idx >= 0 and self.prev_idx != self.idx:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of a tensor current (no-op for CPU tensors)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "neuron" else None)


@dataclass(frozen=True)
class _NeuronDeviceProperties:
    name: str
    index: int
    physical_index: int
    chip: int
    physical_cores: int
    major: int
    minor: int
    total_memory: int
    sbuf_bytes: int
    psum_bytes: int

    def __repr__(self) -> str:
        return (
            f"_NeuronDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, physical_cores={self.physical_cores})"
        )


def get_device_properties(device: _device_t = None) -> _NeuronDeviceProperties:
    _lazy_init()
    return _NeuronDeviceProperties(**_C._get_device_properties(_device_index(device)))


def get_device_name(device: _device_t = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: _device_t = None) -> tuple:
    p = get_device_properties(device)
    return (p.major, p.minor)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return is_available()


def get_amp_supported_dtype() -> List[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def synchronize(device: _device_t = None) -> None:
    _lazy_init()
    _C._synchronize(_device_index(device))


def __getattr__(name: str) -> Any:
    # Inductor looks these up on the device module when it initializes its backends: the neuron code
    # generator is imported (and registered) only then.
    if name in ("Scheduling", "PythonWrapperCodegen"):
        from .. import _inductor

        _inductor.register()
        return _inductor.CppScheduling if name == "Scheduling" else _inductor.NeuronWrapperCodegen
    # torch.utils.checkpoint saves and restores a device's RNG state only when its module's _initialized
    # is true (torch.cuda's flag): without it, a checkpointed dropout drew new numbers in the recompute,
    # and the gradients were those of another mask.
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module 'torch.neuron' has no attribute '{name}'")


__all__ = [
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device", "device",
    "device_of", "get_device_name", "get_device_properties", "get_device_capability", "is_bf16_supported",
    "get_amp_supported_dtype", "synchronize", "Stream", "Event", "StreamContext", "current_stream",
    "default_stream", "set_stream", "stream", "manual_seed", "manual_seed_all", "seed", "seed_all",
    "initial_seed", "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all",
    "default_generators", "empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "memory_summary", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
    "reset_max_memory_allocated", "memory_stats", "mem_get_info", "set_per_process_memory_fraction",
]
