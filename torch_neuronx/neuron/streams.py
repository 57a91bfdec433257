"""Streams and events. In this driver work runs synchronously, in submission order; stream and event
semantics (query, synchronize, wait, elapsed time) hold as they would with asynchronous execution."""

from typing import Any, Optional

import torch


def _index(device) -> int:
    from . import _device_index, _lazy_init

    _lazy_init()
    return _device_index(device)


class _NeuronTypeMeta(type):
    """isinstance(x, torch.neuron.Stream) holds for any torch.Stream on a neuron device (same for Event).

    The constructors return plain torch.Stream / torch.Event objects: PyTorch's C++ methods (for example
    Event.elapsed_time) accept only those exact types, not Python subclasses."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls._base) and obj.device.type == "neuron"


class Stream(metaclass=_NeuronTypeMeta):
    """A neuron stream. ``priority``: 0 (default, low) or -1 (high), as for CUDA streams."""

    _base = torch.Stream

    def __new__(cls, device=None, priority: int = 0, **kwargs: Any) -> torch.Stream:
        if "stream_id" in kwargs:
            return torch.Stream(**kwargs)
        return torch.Stream(device=torch.device("neuron", _index(device)), priority=priority)


class Event(metaclass=_NeuronTypeMeta):
    """A neuron event; ``enable_timing=True`` for ``elapsed_time``."""

    _base = torch.Event

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                device=None) -> torch.Event:
        return torch.Event(device=torch.device("neuron", _index(device)), enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)


def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(_index(device))


def default_stream(device=None) -> torch.Stream:
    idx = _index(device)
    device_type = torch.accelerator.current_stream(idx).device_type  # c10's enum value for neuron
    return torch.Stream(stream_id=0, device_index=idx, device_type=device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes ``stream`` current on its device inside the block (None: no-op)."""

    def __init__(self, stream: Optional[torch.Stream]):
        self.stream = stream
        self.prev: Optional[torch.Stream] = None

    def __enter__(self):
        if self.stream is not None:
            self.prev = torch.accelerator.current_stream(self.stream.device_index)
            torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: Any) -> bool:
        if self.stream is not None and self.prev is not None:
            torch.accelerator.set_stream(self.prev)
        return False


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    return StreamContext(stream)
