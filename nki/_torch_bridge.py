"""Neuron (and CPU) torch tensors as NKI HBM tensors, on their own memory: a neuron tensor's storage is
host-addressable, so a numpy array is laid over ``untyped_storage().data_ptr()`` (no copy)."""

from __future__ import annotations

import ctypes

import numpy as np

from ._core import NkiError, NkiTensor, Storage, shared_hbm, to_dtype


def torch_dtype(dt):
    import torch

    name = {"bool_": "bool"}.get(dt.name, dt.name)
    t = getattr(torch, name, None)
    if t is None:
        raise NkiError(f"no torch dtype for {dt}")
    return t


def storage_of(t, dt=None):
    """A Storage over the whole untyped storage of tensor ``t`` (kept alive by the Storage)."""
    dt = dt or to_dtype(t.dtype)
    st = t.untyped_storage()
    nbytes = st.nbytes()
    if nbytes == 0:
        flat = np.empty(0, dtype=dt.storage)
    else:
        buf = (ctypes.c_uint8 * nbytes).from_address(st.data_ptr())
        flat = np.frombuffer(buf, dtype=np.uint8).view(dt.storage)
    return Storage(flat, dt, shared_hbm, owner=t)


def from_torch(t) -> NkiTensor:
    dt = to_dtype(t.dtype)
    if t.device.type not in ("neuron", "cpu", "privateuseone"):
        raise NkiError(f"nki kernels run on neuron or CPU tensors, got a tensor on {t.device}")
    return NkiTensor(storage_of(t, dt), tuple(t.shape), tuple(t.stride()), t.storage_offset())


_SYNC = None


def sync_fn():
    """torch.neuron.synchronize, looked up once (the replay path calls it on every call)."""
    global _SYNC
    if _SYNC is None:
        import torch

        mod = getattr(torch, "neuron", None)
        _SYNC = getattr(mod, "synchronize", None) or (lambda: None)
    return _SYNC


def synchronize(device):
    import torch

    mod = getattr(torch, "neuron", None)
    if device is not None and device.type != "cpu" and mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()
