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


def _replace_entries(table: dict, base, new) -> bool:
    """Puts ``new`` wherever ``table`` (Inductor's lowerings or decompositions) holds ``base``: one function is
    registered under several overloads (default, out, ...). True if any entry changed."""
    keys = [key for key, value in table.items() if value is base]
    for key in keys:
        table[key] = new
    return bool(keys)


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
    _replace_entries(lowering.lowerings, base, cat)  # aten.cat, its default and out overloads

    # A right pad is lowered as cat([x, fill]) unless the device is CPU, whose ConcatKernel would spend a fill
    # kernel and a copy on what one pointwise pad loop does: the same holds now for neuron.
    pad_as_cat = lowering._pad_as_cat

    def _pad_as_cat(x, padding, fill_value):
        device = x.get_device()
        if device is not None and device.type == "neuron":
            return None
        return pad_as_cat(x, padding, fill_value)

    lowering._pad_as_cat = _pad_as_cat


def _reductions_like_cpu() -> None:
    """Two reduction lowerings choose by ``device.type == "cpu"`` between what the C++ code generator needs and
    what Triton does; neuron's kernels are the C++ ones.

    argmax/argmin over several dimensions of a permuted or strided input: the C++ and Triton kernels reduce in
    the input's memory order, so CPU pairs each value with its logical (row-major) index. Without it neuron
    returned the position in memory order: ``argmax(x.permute(2, 0, 1))`` of a 6x8x5 tensor gave 59 where
    eager (and CPU Inductor) gives 203. The same index, computed here when the lowering did not.

    var_mean / var / std: CPU computes a reduction of up to ``cpp.use_two_step_variance_threshold`` (1024)
    elements in two passes (the mean, then the sum of squared deviations) and Welford only above it; other
    devices take Welford from ``unroll_reductions_threshold`` (8) up. Welford's fp32 update lost accuracy on
    data with a large mean (1e4 + randn over 1024: variance off by 3.7e-4 against 1.7e-6 for two passes) and
    does more work per element, so LayerNorm(768/1024) and small GroupNorm groups paid for both."""
    import sympy

    from torch._inductor import config, ir, lowering

    make_inner = lowering._make_reduction_inner
    if getattr(make_inner, "_neuron", False):
        return
    argreductions = ("argmax", "argmin", "argmax_value", "argmin_value", "argmax_with_value",
                     "argmin_with_value")

    def _make_reduction_inner(x, *, axis, keepdims, dtype, override_return_dtype, reduction_type=None):
        kwargs = make_inner(x, axis=axis, keepdims=keepdims, dtype=dtype,
                            override_return_dtype=override_return_dtype, reduction_type=reduction_type)
        if reduction_type not in argreductions or ir.get_device_type(x) != "neuron":
            return kwargs
        # CPU's test of the input (lowering._make_reduction_inner): a permute, or a buffer or view that is
        # transposed or not contiguous, reduced over more than one dimension.
        if dtype is not None:
            x = lowering.to_dtype(x, dtype)
        reduced_sizes = kwargs["reduction_ranges"]
        if len(reduced_sizes) < 2:
            return kwargs
        if isinstance(x.data, lowering.PermuteView):
            logical = True
        elif isinstance(x.data, ir.ReinterpretView) or (
                isinstance(x.data, ir.StorageBox) and isinstance(x.data.data, ir.Buffer)):
            layout = x.get_layout()
            logical = layout.is_transposed() or not layout.is_contiguous()
        else:
            logical = False
        if not logical:
            return kwargs
        load = kwargs["inner_fn"]

        def inner_fn(index, reduction_index):
            linear = sympy.expand(reduction_index[0])
            for r, n in zip(reduction_index[1:], reduced_sizes[1:]):
                linear = linear * n + sympy.expand(r)
            return load(index, reduction_index), lowering.ops.index_expr(linear, torch.int64)

        kwargs["inner_fn"] = inner_fn
        return kwargs

    _make_reduction_inner._neuron = True
    _make_reduction_inner._neuron_base = make_inner
    lowering._make_reduction_inner = _make_reduction_inner

    two_step = lowering.use_two_step_variance

    def use_two_step_variance(x, axis, keepdim, input_dtype):
        # For a device other than CPU and CUDA the base takes unroll_reductions_threshold as its threshold
        # and nothing else: with CPU's threshold in its place it decides exactly as for CPU.
        if ir.get_device_type(x) == "neuron":
            with config.patch(unroll_reductions_threshold=config.cpp.use_two_step_variance_threshold):
                return two_step(x, axis, keepdim, input_dtype)
        return two_step(x, axis, keepdim, input_dtype)

    use_two_step_variance._neuron_base = two_step
    lowering.use_two_step_variance = use_two_step_variance


def _divide_like_cpu() -> None:
    """Inductor turns ``x / c`` for a constant c into ``x * (1/c)`` except on CPU, which keeps the division
    (pytorch#157959: the product is off by an ulp from eager's quotient for most c). Neuron's eager division
    is a true division too, so a compiled ``x / 3.0`` differed from eager in the last bit; neuron keeps it."""
    from torch._inductor import lowering
    from torch._inductor.ir import IRNode

    base = lowering.div_prim  # the registered lowering (broadcast and type promotion around the function)
    if getattr(base, "_neuron", False):
        return
    fn = base.__wrapped__
    ops = lowering.ops

    def div_prim(a, b):
        device = a.get_device() if isinstance(a, IRNode) else None
        if (device is not None and device.type == "neuron"
                and not all(lowering.is_boolean_type(v) or lowering.is_integer_type(v) for v in (a, b))
                and lowering.get_constant_value(b) is not None):
            return lowering.make_pointwise(lambda x, y: ops.truediv(x, y))(a, b)
        return fn(a, b)

    prims = torch.ops.prims
    wrapped = lowering.register_lowering([prims.div], broadcast=True)(div_prim)
    wrapped._neuron = True
    wrapped._neuron_base = base
    _replace_entries(lowering.lowerings, base, wrapped)
    lowering.div_prim = wrapped


def _small_products_like_cpu() -> None:
    """Inductor's decompositions of aten.mm/addmm/bmm turn some tiny products into fused loops on CPU only
    (``self.device.type == "cpu"`` in decomposition.py): a row times a column (1xK @ Kx1, and the batched
    Bx1xK @ BxKx1) becomes a multiply-and-sum, and a one-row linear layer on a weight of at most 16x16 a
    multiply-and-sum over the weight. Elsewhere they stay extern kernels, for neuron a dispatcher call each
    that the C++ kernel around them cannot fuse: 1x256 @ 256x1 (+relu) ran 1.9x, a 16x16 one-row linear
    (+tanh) 1.3x, 64 batched 128-dots 1.4x slower than as the fused loop. Neuron decomposes them as CPU does
    (before the rest of each decomposition, whose GPU branches - outer products as a broadcast multiply -
    neuron keeps: no measurable difference against the extern kernel)."""
    from torch._inductor import decomposition as decomp
    from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true

    aten = torch.ops.aten
    table = decomp.decompositions

    @decomp.pw_cast_for_opmath
    def mm(self, input2, out_dtype=None):
        if statically_known_true(self.size(0) == 1) and statically_known_true(input2.size(-1) == 1):
            return torch.sum(self.squeeze(0) * input2.squeeze(-1), dim=0, keepdim=True).unsqueeze(0)
        return NotImplemented

    @decomp.pw_cast_for_opmath
    def addmm(self, mat1, mat2, out_dtype=None, beta=1, alpha=1):
        if statically_known_true(mat1.size(0) == 1) and statically_known_true(mat2.size(-1) == 1):
            out = torch.sum(mat1.squeeze(0) * mat2.squeeze(-1), dim=0, keepdim=True).unsqueeze(0)
            return alpha * out + beta * self
        if (statically_known_true(mat1.size(0) == 1) and guard_or_false(mat2.size(0) <= 16)
                and guard_or_false(mat2.size(1) <= 16)):
            return alpha * (mat1.T * mat2).sum(dim=0, keepdim=True) + beta * self
        return NotImplemented

    @decomp.pw_cast_for_opmath
    def bmm(self, batch2, out_dtype=None):
        if statically_known_true(self.size(1) == 1) and statically_known_true(batch2.size(-1) == 1):
            return torch.sum(self.squeeze(1) * batch2.squeeze(-1), dim=1, keepdim=True).unsqueeze(1)
        return NotImplemented

    changed = False
    for op, cpu_rule, on in ((aten.mm, mm, 0), (aten.addmm, addmm, 1), (aten.bmm, bmm, 0)):
        base = table.get(op.default)
        if base is None or getattr(base, "_neuron", False):
            continue

        def decomposition(*args, _base=base, _cpu_rule=cpu_rule, _on=on, _name=op.__name__.split(".")[-1], **kwargs):
            # on: the operand whose device the CPU rule's own test looks at (addmm's mat1 for the rule on
            # mat1's shape; the bias may be a broadcast scalar tensor).
            if args[_on].device.type == "neuron" and kwargs.get("out_dtype") is None:
                out = _cpu_rule(*args, **kwargs)
                if out is not NotImplemented:
                    decomp.counters["inductor"][f"decompose_{_name}"] += 1
                    return out
            return _base(*args, **kwargs)

        decomposition._neuron = True
        decomposition._neuron_base = base
        changed |= _replace_entries(table, base, decomposition)
    if changed:
        decomp.fast_random_decomps.cache_clear()  # a memoized copy of the table


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
        _reductions_like_cpu()
        _divide_like_cpu()
        _small_products_like_cpu()
        register_device_op_overrides("neuron", NeuronDeviceOpOverrides())
        if get_scheduling_for_device("neuron") is None:
            register_backend_for_device("neuron", CppScheduling, NeuronWrapperCodegen,
                                        device_custom_config=_inductor_config)
        _registered = True
