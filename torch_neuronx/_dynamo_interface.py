"""The Dynamo device interface of ``neuron`` (streams, events, device queries Dynamo and Inductor ask for).

Importing ``torch._dynamo`` costs seconds, so ``import torch`` must not do it. ``install()`` registers the
interface at once when Dynamo is already loaded, and otherwise as soon as Dynamo's device-interface module
finishes loading (a one-shot import hook), which is before Dynamo or Inductor can look the device up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections import namedtuple
from typing import Any

import torch

_MODULE = "torch._dynamo.device_interface"
_lock = threading.Lock()
_registered = False

# What Inductor reads from device properties; kernels run on host threads, so a "processor" is a thread.
_Properties = namedtuple("_NeuronInductorProperties", [
    "name", "major", "minor", "total_memory", "multi_processor_count", "physical_cores"])


def _properties(device: Any = None) -> _Properties:
    p = torch.neuron.get_device_properties(device)
    return _Properties(p.name, p.major, p.minor, p.total_memory, max(1, torch.get_num_threads()),
                       p.physical_cores)


def _make_interface(base: type) -> type:
    neuron = torch.neuron

    class NeuronInterface(base):
        device = neuron.device
        Event = neuron.Event
        Stream = neuron.Stream

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                neuron.set_device(device)

            @staticmethod
            def current_device() -> int:
                return neuron.current_device()

            @staticmethod
            def get_device_properties(device: Any = None) -> _Properties:
                return _properties(device)

        @staticmethod
        def current_device() -> int:
            return neuron.current_device()

        @staticmethod
        def set_device(device: Any) -> None:
            neuron.set_device(device)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            prev = neuron.current_device()
            if device >= 0 and device != prev:
                neuron.set_device(device)
            return prev

        @staticmethod
        def exchange_device(device: int) -> int:
            prev = neuron.current_device()
            if device != prev:
                neuron.set_device(device)
            return prev

        @staticmethod
        def device_count() -> int:
            return neuron.device_count()

        @staticmethod
        def is_available() -> bool:
            return neuron.is_available()

        @staticmethod
        def stream(stream: torch.Stream) -> Any:
            return neuron.stream(stream)

        @staticmethod
        def current_stream() -> torch.Stream:
            return neuron.current_stream()

        @staticmethod
        def set_stream(stream: torch.Stream) -> None:
            neuron.set_stream(stream)

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            neuron.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                           device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            # Generated kernels run synchronously on the calling thread; they take no stream handle.
            return 0

        @staticmethod
        def synchronize(device: Any = None) -> None:
            neuron.synchronize(device)

        @classmethod
        def get_device_properties(cls, device: Any = None) -> _Properties:
            return _properties(device)

        @staticmethod
        def get_compute_capability(device: Any = None) -> str:
            major, minor = neuron.get_device_capability(device)
            return f"{major}{minor}"

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return neuron.is_bf16_supported()

        @classmethod
        def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
            return True

        @staticmethod
        def memory_allocated(device: Any = None) -> int:
            return neuron.memory_allocated(device)

        @staticmethod
        def is_triton_capable(device: Any = None) -> bool:
            return False

        @classmethod
        def raise_if_triton_unavailable(cls, device: Any = None) -> None:
            raise RuntimeError("the neuron device compiles C++ kernels, not Triton kernels")

    NeuronInterface.__name__ = NeuronInterface.__qualname__ = "NeuronInterface"
    return NeuronInterface


def _align_fake_conv_layout() -> None:
    """Traced convolutions on neuron get the output layout eager neuron gives them.

    FakeTensor's convolution picks the output memory format from the backend ``_select_conv_backend``
    names: for a PrivateUse1 device that is ``Overrideable``, for which it answers "contiguous" always. Eager
    neuron convolution follows CPU (mkldnn): channels-last output when the input or the weight is
    channels-last. Inductor turns a graph's convolutions channels-last when it sees fit, so the compiled code
    expected contiguous strides and failed its ``assert_size_stride`` (a tiny Stable Diffusion UNet under
    ``torch.compile(backend="neuron")``). Answer for neuron as for CPU's mkldnn backend."""
    determine = torch._C._conv_determine_backend_memory_format
    if getattr(determine, "_neuron", False):
        return
    overrideable = torch._C._ConvBackend.Overrideable
    mkldnn = torch._C._ConvBackend.Mkldnn

    def determine_backend_memory_format(input, weight, backend):
        if backend == overrideable and input.device.type == "neuron":
            backend = mkldnn
        return determine(input, weight, backend)

    determine_backend_memory_format._neuron = True
    torch._C._conv_determine_backend_memory_format = determine_backend_memory_format


def _register(module: Any) -> None:
    global _registered
    with _lock:
        if _registered:
            return
        _align_fake_conv_layout()
        iface = _make_interface(module.DeviceInterface)
        module.register_interface_for_device("neuron", iface)
        for i in range(torch.neuron.device_count()):
            module.register_interface_for_device(f"neuron:{i}", iface)
        _registered = True


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        _register(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of Dynamo's device-interface module once, then steps aside."""

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
    """Registers the interface now if Dynamo is loaded, else when it loads."""
    module = sys.modules.get(_MODULE)
    if module is not None and hasattr(module, "register_interface_for_device"):
        _register(module)
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
