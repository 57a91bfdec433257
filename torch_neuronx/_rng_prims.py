"""Neuron implementations of PyTorch's RNG-functionalisation operators.

When AOTAutograd recomputes a random op in the backward pass (activation checkpointing, selective
checkpointing, or an op tagged ``nondeterministic_seeded`` such as SDPA, even at dropout 0), it wraps the
forward call in ``run_and_save_rng_state`` (returns the generator state before the op, and the op's
result) and the backward call in ``run_with_rng_state`` (replays the op from that state), so both draw
the same numbers. ``torch._prims.rng_prims`` implements them for CPU, CUDA, HPU and XPU, and its
device switch (``impl_backend_select``) asserts on every other device type: that is what a compiled,
checkpointed training step on neuron raised ("Backend not supported for neuron").

The state is the neuron generator's, of the device the op runs on (``torch.neuron.get_rng_state``), so a
compiled step draws what the eager step draws from the same seed.
"""

import torch
from torch._C import DispatchKey
from torch._prims import rng_prims
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

_installed = False


def _device_index(args, kwargs) -> int:
    device = kwargs.get("device")
    if device is not None:
        device = torch.device(device)
        return torch.neuron.current_device() if device.index is None else device.index
    for arg in pytree.tree_leaves((args, kwargs)):
        if isinstance(arg, torch.Tensor) and arg.device.type == "neuron":
            return arg.device.index
    return torch.neuron.current_device()


def _run_and_save(op, *args, **kwargs):
    # The state is a real CPU tensor even while tracing with fake tensors, as CPU's is (the generator
    # writes into it, which a fake tensor mode would intercept).
    with _disable_current_modes():
        state = torch.neuron.get_rng_state(_device_index(args, kwargs))
    return state, op(*args, **kwargs)


def _run_with(rng_state, op, *args, **kwargs):
    index = _device_index(args, kwargs)
    current = torch.neuron.get_rng_state(index)
    torch.neuron.set_rng_state(rng_state.cpu(), index)
    try:
        return op(*args, **kwargs)
    finally:
        torch.neuron.set_rng_state(current, index)


def _with_neuron(original, neuron_impl):
    """original's device switch, sending neuron arguments to neuron_impl."""

    def backend_select(*args, **kwargs):
        # run_with_rng_state's first argument is the saved state (a CPU tensor): the device is the op's.
        op_args = args[2:] if neuron_impl is _run_with else args[1:]
        if rng_prims.get_device(op_args, kwargs) == "neuron":
            return neuron_impl(*args, **kwargs)
        return original(*args, **kwargs)

    return backend_select


def _proxy_impl(hop, backend_select):
    """The ProxyTorchDispatchMode rule of rng_prims (run eagerly on fakes, record one node), calling the
    device switch that knows neuron."""
    from torch.fx.experimental.proxy_tensor import track_tensor_tree

    def impl(mode, *args, **kwargs):
        out = backend_select(*args, **kwargs)
        proxy_args = pytree.tree_map(mode.tracer.unwrap_proxy, args)
        proxy_kwargs = pytree.tree_map(mode.tracer.unwrap_proxy, kwargs)
        out_proxy = mode.tracer.create_proxy("call_function", hop, proxy_args, proxy_kwargs)
        return track_tensor_tree(out, out_proxy, constant=None, tracer=mode.tracer)

    return impl


def install() -> None:
    """Adds neuron to both operators: its dispatch key, the device switch, fake tensors and tracing."""
    global _installed
    if _installed:
        return
    from torch._higher_order_ops.utils import registered_hop_fake_fns
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode

    for hop, impl in ((rng_prims.run_and_save_rng_state, _run_and_save), (rng_prims.run_with_rng_state, _run_with)):
        hop.py_impl(DispatchKey.PrivateUse1)(impl)
        hop.py_kernels[DispatchKey.BackendSelect] = _with_neuron(hop.py_kernels[DispatchKey.BackendSelect], impl)
        hop._dispatch_cache.clear()
    # run_and_save_rng_state's fake and tracing rules call its device switch directly (run_with_rng_state's
    # just run the op), so they are replaced by ones calling the switch above.
    hop = rng_prims.run_and_save_rng_state
    select = hop.py_kernels[DispatchKey.BackendSelect]
    registered_hop_fake_fns[hop] = select
    hop.python_key_table[ProxyTorchDispatchMode] = _proxy_impl(hop, select)
    hop._dispatch_cache.clear()
    _installed = True
