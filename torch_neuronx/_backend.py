"""Registers the neuron device with PyTorch (once per process)."""

import atexit
import os
import sys
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
        device_module._bind_to_launcher_rank()
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
        from .distributed import register as register_distributed

        register_distributed()
        _run_backward_on_calling_thread()
        _register_compiler_hooks()
        _adopt_mixed_precision_defaults()
        from . import _rng_prims

        _rng_prims.install()
        from . import _safetensors_compat

        _safetensors_compat.install()
        from . import _transformers_compat

        _transformers_compat.install()
        _loaded = True


def _run_backward_on_calling_thread() -> None:
    """Runs backward for neuron tensors on the thread that calls it, as for CPU tensors.

    Autograd otherwise gives every non-CPU device its own worker thread and hands each node to it. Kernels
    run synchronously on the host, so the hand-off buys nothing, and it races with interpreter exit: the
    worker can drop the last reference to a finished graph task (whose thread-local state holds Python
    objects) after the main thread has started finalizing Python, and taking the GIL then kills the
    thread inside a destructor, so the process aborts ("terminate called without an active exception";
    3 of 20 runs of a tiny-Llama forward+backward script). The setting is the importing thread's
    (``torch.autograd.set_multithreading_enabled``), which is where scripts call backward."""
    torch._C._set_multithreading_enabled(False)


def _register_compiler_hooks() -> None:
    """Makes torch.compile work on neuron without importing Dynamo or Inductor now (they cost seconds).

    Dynamo's device interface is registered when Dynamo loads; Inductor finds the neuron code generator
    through ``torch.neuron.Scheduling`` when it initializes its backends. If either is already loaded
    (torch_neuronx imported late), registration happens here."""
    from . import _dynamo_interface

    _dynamo_interface.install()
    if os.environ.get("TORCH_NEURONX_COMPILE_REPORT", "0") not in ("", "0"):
        atexit.register(_report_at_exit)
    if "torch._inductor.codegen.common" in sys.modules:
        from . import _inductor

        _inductor.register()


def _adopt_mixed_precision_defaults() -> None:
    """Gives neuron CPU's picks where PyTorch chooses an algorithm per device type.

    ``F.linear_cross_entropy`` resolves ``acc_policy="auto"`` from a table keyed by (device type, dtype) and
    accumulates bf16/fp16 in float32 only on devices it knows have a mixed-precision matmul; any other device
    gets a low-precision policy. neuron's matmul accumulates bf16/fp16 in float32 (as NeuronCores do), so the
    CPU entries are the right ones, and with them neuron computes what CPU computes."""
    try:
        from torch.nn.modules import linear_cross_entropy_options as lce
    except ImportError:
        return
    table = getattr(lce, "_AUTO_DEFAULTS", None)
    cls = getattr(lce, "LinearCrossEntropyOptions", None)
    resolve = getattr(cls, "__dict__", {}).get("_resolve_auto_acc_dtype")
    if not isinstance(table, dict) or not isinstance(resolve, staticmethod):
        return  # another torch layout: keep PyTorch's own choice
    for dtype in (torch.bfloat16, torch.float16):
        if ("cpu", dtype) in table:
            table.setdefault(("neuron", dtype), table[("cpu", dtype)])
    base = resolve.__func__

    def resolve_auto_acc_dtype(dtype, device):
        if device is not None and device.type == "neuron" and dtype in (torch.bfloat16, torch.float16):
            return torch.float32
        return base(dtype, device)

    cls._resolve_auto_acc_dtype = staticmethod(resolve_auto_acc_dtype)


def _report_at_exit() -> None:
    if "torch._dynamo" not in sys.modules:
        return  # nothing was compiled
    from .compiler import report

    report()
