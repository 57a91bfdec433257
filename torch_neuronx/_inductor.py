"""Inductor code generation for ``neuron``.

Device memory is addressable from the host, so Inductor's C++ CPU kernels run on it unchanged: the
scheduler is Inductor's ``CppScheduling`` and the wrapper passes neuron tensors to the compiled kernels,
which read their data pointers. Buffers the wrapper allocates are neuron tensors (``empty_strided`` on
the neuron device, so they come from the device's caching allocator). Extern kernels (mm, addmm, bmm,
attention...) stay calls into ATen operators on neuron tensors, which reach our native kernels through
the dispatcher.

Imported lazily: Inductor asks ``torch.neuron`` for ``Scheduling`` and the wrapper classes when it first
initializes its device backends (see ``torch.neuron.__getattr__``), and this module registers everything
the device needs at that moment.

While torch.profiler records, each generated kernel the wrapper calls is one device event
("[neuron] cpp_fused_..."), with the shapes, dtypes and bytes of its tensor arguments, on the device row
inside its graph's event; otherwise the call costs one flag check.
"""

from __future__ import annotations

import threading

import torch
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    get_scheduling_for_device,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen

from . import _C, _dynamo_interface, _inductor_config

_lock = threading.Lock()
_registered = False


class NeuronDeviceOpOverrides(DeviceOpOverrides):
    """Python snippets the wrapper emits for device management."""

    def import_get_raw_stream_as(self, name: str) -> str:
        # Kernels run synchronously on the calling thread; there is no stream handle to pass.
        return f"def {name}(_):\n    return 0\n"

    def set_device(self, device_idx: int) -> str:
        # Inductor writes this only right inside device_guard(), which has made the device current.
        return ""

    def synchronize(self) -> str:
        return "torch.neuron.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"_neuron_device_guard({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


class _ProfiledKernel:
    """A generated kernel's call while a profiler runs: a record_function range named after the kernel on the
    host row and, when device activities are recorded, the kernel's device event linked to it."""

    __slots__ = ("name", "args", "range", "token")

    def __init__(self, name: str, *args) -> None:
        self.name = name
        self.args = args

    def __enter__(self) -> None:
        self.range = torch.autograd.profiler.record_function(self.name)
        self.range.__enter__()
        self.token = _C._prof_kernel_begin(self.name, [a for a in self.args if isinstance(a, torch.Tensor)])

    def __exit__(self, *exc) -> None:
        _C._prof_kernel_end(self.token)
        self.range.__exit__(*exc)


class NeuronWrapperCodegen(PythonWrapperCodegen):
    """Python wrapper whose generated C++ kernels are called like CPU kernels, on neuron tensors."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NeuronWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline("from torch.autograd import profiler as _neuron_profiler")
        self.imports.writeline("from torch_neuronx._inductor import _ProfiledKernel as _neuron_kernel")
        self.imports.writeline("from torch_neuronx.neuron import device as _neuron_device_guard")

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, **kwargs):
        from torch._inductor.virtualized import V

        device = device or V.graph.get_current_device_or_throw()
        if device.type == "neuron" and not kwargs.get("triton", True):
            # A C++ kernel: a direct call with the tensors, exactly as on CPU. Under a profiler (PyTorch's
            # flag, a module attribute: the cheapest check there is) it runs inside a named range.
            call = self.wrap_kernel_call(kernel_name, call_args)
            self.writeline("if _neuron_profiler._is_profiler_enabled:")
            self.writeline(f"    with _neuron_kernel({', '.join([repr(kernel_name), *map(str, call_args)])}):")
            self.writeline(f"        {call}")
            self.writeline("else:")
            self.writeline(f"    {call}")
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, **kwargs)


def _treat_neuron_as_cpp_device() -> None:
    """Inductor asks "is this CPU?" where it means "is this C++ code generation?" (fusion heuristics and
    loop reindexing that only hold for its SIMD/Triton kernels, realization thresholds tuned for C++).
    Neuron kernels are those C++ kernels, so these predicates must answer yes for neuron too; the checks
    about memory (allocation, pinning, cross-device copies) compare ``device.type`` directly and stay
    untouched."""
    from torch._inductor import ir, scheduler

    if getattr(ir.is_cpu, "_neuron", False):
        return
    cpu_like = ("cpu", "neuron")
    get_device_type = ir.get_device_type

    def is_cpu(x) -> bool:
        return get_device_type(x) in cpu_like

    is_cpu._neuron = True
    ir.is_cpu = is_cpu

    def node_is_cpu(self) -> bool:
        device = self.get_device()
        return device is not None and device.type in cpu_like

    scheduler.BaseSchedulerNode.is_cpu = node_is_cpu

    # Which code generator serves the current device: for neuron it is the C++ one (unknown devices would
    # otherwise be taken for Triton GPUs). Patched where the function was imported by name.
    import importlib

    from torch._inductor import config, utils

    base = utils.get_current_backend

    def get_current_backend(device_type=None) -> str:
        if not device_type:
            from torch._inductor.virtualized import V

            device_type = V.graph.get_current_device_or_throw().type
        if device_type == "neuron":
            return config.cpu_backend
        return base(device_type)

    for name in ("torch._inductor.utils", "torch._inductor.codegen.common", "torch._inductor.scheduler",
                 "torch._inductor.kernel.mm_common"):
        mod = importlib.import_module(name)
        if getattr(mod, "get_current_backend", None) is base:
            mod.get_current_backend = get_current_backend


def _guard_neuron_device() -> None:
    """Inductor enters a device guard around a graph's code only for GPU devices; without it a graph of
    tensors on neuron:1 allocated its buffers on the current device (neuron:0) and an extern kernel then
    mixed the two. The wrapper enters a guard of the graph's device for neuron too (``torch.neuron.device``)."""
    from torch._inductor import scheduler

    base = scheduler.device_need_guard
    if getattr(base, "_neuron", False):
        return

    def device_need_guard(device: str) -> bool:
        return device == "neuron" or base(device)

    device_need_guard._neuron = True
    scheduler.device_need_guard = device_need_guard


def _concat_like_cpu() -> None:
    """Inductor lowers ``cat`` on CPU to a ConcatKernel (each input written into its slice of the output, by
    its own vectorized kernel or fused into its producer) and elsewhere, for GPUs, to a pointwise cat: one
    loop over the output that picks each element's input with index masks. The C++ code generator does not
    vectorize those masked loads, so on neuron a Flux single block's ``cat([attn, gelu(mlp)])`` (320 x 15360
    fp32) ran as a scalar loop with a tanh per element, 48 ms per call against 9 ms the CPU way. The CPU
    decision compares ``device.type == "cpu"``; neuron's C++ kernels take the same route here."""
    from torch._inductor import config, ir, lowering

    aten = torch.ops.aten
    base = lowering.lowerings[aten.cat]
    if getattr(base, "_neuron", False):
        return

    def cat(inputs, dim=0):
        device = inputs[0].get_device() if inputs else None
        if device is None or device.type != "neuron" or config.force_pointwise_cat or len(inputs) == 1:
            return base(inputs, dim)
        if all(x.get_dtype() in (torch.int8, torch.uint8) for x in inputs):
            return base(inputs, dim)  # the generic path; its int8 fallback is for CPU's vectorizer only
        sizevars = lowering.V.graph.sizevars
        kept = [x for x in inputs
                if not (len(x.get_size()) == 1 and sizevars.statically_known_equals(x.get_size()[0], 0))]
        if len(kept) < 2:
            return base(inputs, dim)  # ATen's skipping of empty 1-D inputs leaves a copy: the generic path
        dim = lowering._validate_dim(kept[0], dim, 0)
        dtype = lowering.get_promoted_dtype(
            *kept, type_promotion_kind=lowering.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
        kept = [lowering.to_dtype(x, dtype) for x in kept]
        return lowering.TensorBox(ir.ConcatKernel.create(kept, dim))

    cat._neuron = True
    lowering.lowerings[aten.cat] = cat
    for key, fn in list(lowering.lowerings.items()):
        if fn is base:  # aten.cat, its default and out overloads
            lowering.lowerings[key] = cat

    # A right pad is lowered as cat([x, fill]) unless the device is CPU, whose ConcatKernel would spend a fill
    # kernel and a copy on what one pointwise pad loop does: the same holds now for neuron.
    pad_as_cat = lowering._pad_as_cat

    def _pad_as_cat(x, padding, fill_value):
        device = x.get_device()
        if device is not None and device.type == "neuron":
            return None
        return pad_as_cat(x, padding, fill_value)

    lowering._pad_as_cat = _pad_as_cat


def register() -> None:
    """Registers the neuron codegen with Inductor and the device interface with Dynamo (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        _dynamo_interface.install()
        _treat_neuron_as_cpp_device()
        _guard_neuron_device()
        _concat_like_cpu()
        register_device_op_overrides("neuron", NeuronDeviceOpOverrides())
        if get_scheduling_for_device("neuron") is None:
            register_backend_for_device("neuron", CppScheduling, NeuronWrapperCodegen,
                                        device_custom_config=_inductor_config)
        _registered = True
