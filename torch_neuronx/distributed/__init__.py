"""torch.distributed on ``neuron``: the ``neuron`` process group backend.

Registered when torch_neuronx loads, so under ``torchrun``::

    dist.init_process_group()                      # picks "neuron" on a neuron machine
    dist.init_process_group("neuron")              # neuron tensors and CPU tensors
    dist.init_process_group(device_id=torch.device("neuron", local_rank))

Ranks on one host exchange neuron tensors through shared memory (the C collectives in
``csrc/collectives``). CPU tensors, ranks on several hosts, and every op when
``TORCH_NEURONX_DIST_FORCE_GLOO=1`` go through a Gloo backend created from the same store.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

BACKEND_NAME = "neuron"
FORCE_GLOO_ENV = "TORCH_NEURONX_DIST_FORCE_GLOO"

_registered = False


def _force_gloo() -> bool:
    return os.environ.get(FORCE_GLOO_ENV, "0").strip().lower() not in ("", "0", "false", "no", "off")


def _timeout_seconds(timeout) -> float:
    if timeout is None:
        return 1800.0
    if isinstance(timeout, timedelta):
        return max(timeout.total_seconds(), 1e-3)
    return max(float(timeout), 1e-3)


def _create_backend(opts, pg_options=None):
    """Factory called by init_process_group/new_group with c10d's DistributedBackendOptions."""
    from torch.distributed import PrefixStore, ProcessGroupGloo

    from .. import _C

    rank, size = opts.group_rank, opts.group_size
    timeout = opts.timeout
    # Checked by each rank from its own environment, so every rank raises at once instead of its peers
    # waiting out the group timeout for one that failed.
    error = torch.neuron._binding_error()
    if error is not None:
        raise RuntimeError(f"neuron process group: {error}")
    # The inner Gloo backend serves CPU tensors, monitored_barrier, and the multi-host case. Every rank
    # creates it (it is a collective), with its own key prefix in the group's store.
    gloo = ProcessGroupGloo(PrefixStore("neuron_gloo/", opts.store), rank, size, timeout=timeout)
    return _C._NeuronBackend(opts.store, rank, size, _timeout_seconds(timeout), gloo, _force_gloo())


def _create_split_backend(store, rank, size, timeout_s, force_gloo):
    """Called by the backend's split (C++) on the ranks of a new sub-group, with the sub-group's store."""
    from torch.distributed import PrefixStore, ProcessGroupGloo

    from .. import _C

    gloo = ProcessGroupGloo(PrefixStore("neuron_gloo/", store), rank, size, timeout=timedelta(seconds=timeout_s))
    return _C._NeuronBackend(store, rank, size, timeout_s, gloo, force_gloo)


def _options_class():
    from torch._C._distributed_c10d import Backend

    class NeuronOptions(Backend.Options):
        """What ``backend.options`` returns: split_group deep-copies it and passes it to ``split``."""

        def __init__(self, timeout=timedelta(minutes=30)):
            super().__init__(BACKEND_NAME, timeout)

        def __deepcopy__(self, memo):
            return NeuronOptions(self._timeout)

    return NeuronOptions


def _monitored_barrier_wrapper(original):
    """torch's monitored_barrier accepts only Gloo groups; neuron groups delegate to their Gloo."""
    from torch.distributed import distributed_c10d as c10d

    def monitored_barrier(group=c10d.GroupMember.WORLD, timeout=None, wait_all_ranks=False):
        pg = c10d._get_default_group() if group is None or group is c10d.GroupMember.WORLD else group
        if c10d._rank_not_in_group(pg) or BACKEND_NAME not in str(c10d.get_backend(pg)):
            return original(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = c10d._get_default_timeout(c10d.get_backend(pg))
        elif isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=timeout)
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier.__doc__ = original.__doc__
    monitored_barrier.__wrapped__ = original
    return monitored_barrier


def register() -> None:
    """Registers the backend (idempotent); called when torch_neuronx loads."""
    global _registered
    if _registered or not dist.is_available():
        return
    from .. import _C

    options_class = _options_class()
    # split_group passes its own timeout to the split; the options only have to exist and be copyable.
    _C._NeuronBackend.options = property(lambda self: options_class())
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["neuron", "cpu"])
    # register_backend does not take over "cpu" (Gloo stays its default) but makes neuron's default ours.
    dist.Backend.default_device_backend_map["neuron"] = BACKEND_NAME
    from torch.distributed import distributed_c10d as c10d

    if not hasattr(c10d.monitored_barrier, "__wrapped__"):
        wrapped = _monitored_barrier_wrapper(c10d.monitored_barrier)
        c10d.monitored_barrier = wrapped
        dist.monitored_barrier = wrapped
    _registered = True


def is_shared_memory(group=None) -> bool:
    """True when ``group`` moves neuron tensors through shared memory (False: through Gloo)."""
    from torch.distributed import distributed_c10d as c10d

    pg = group or c10d._get_default_group()
    backend = pg._get_backend(torch.device("neuron"))
    return bool(getattr(backend, "uses_shared_memory", False))


__all__ = ["BACKEND_NAME", "FORCE_GLOO_ENV", "register", "is_shared_memory"]
