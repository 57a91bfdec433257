"""A Neuron Kernel Interface (NKI) package for TorchNeuron: runs NKI kernels written for Trainium, unmodified.

- ``nki.jit`` kernels called with neuron torch tensors run on the tensors' own (host-addressable) memory and
  return neuron tensors; called with numpy arrays, or through ``nki.simulate``, they run on numpy.
- ``nki.language`` (``nl``) and ``nki.isa`` (``nisa``) follow aws-neuron-sdk's API docstrings, including the
  older forms that Hub kernels still use (bare ``sbuf``/``hbm``/``psum`` buffers, tile-returning calls).
- The hardware model: partition dim <= 128, SBUF capacity per partition by target, PSUM 8 x 2 KiB banks,
  nc_matmul limits, values rounded to the destination dtype on every store, NaN-filled fresh allocations.
  A broken limit raises ``nki.NkiError`` naming the limit, the value and the kernel's file:line.

Called with torch tensors, a kernel is traced once per argument signature and replayed in C on the device's kernel
library (``nki/_compile.py``; ``NKI_COMPILE=0`` turns that off); numpy arrays and ``nki.simulate`` run the
per-instruction numpy interpreter, which is the reference.
"""

from __future__ import annotations

import functools
import itertools
import os

import numpy as np

from . import _compile, _core, _torch_bridge, compiler, isa, language  # noqa: F401
from ._core import NkiError, NkiTensor  # noqa: F401

__version__ = "0.1.0"

_BUILTIN_NAMES = {"sbuf": _core.sbuf, "hbm": _core.hbm, "psum": _core.psum, "shared_hbm": _core.shared_hbm,
                  "private_hbm": _core.private_hbm}


def _is_torch(x):
    t = type(x)
    return t.__module__.startswith("torch") and t.__name__ in ("Tensor", "Parameter") or \
        (hasattr(x, "untyped_storage") and hasattr(x, "device"))


class _Args:
    """Converts call arguments to HBM tensors and the kernel's results back."""

    def __init__(self):
        self.writeback = []  # (original numpy array, contiguous copy)
        self.torch_device = None

    def to_nki(self, a):
        if isinstance(a, np.ndarray):
            arr = a
            if arr.dtype.name == "bfloat16" or arr.dtype.kind == "V" and arr.dtype.itemsize == 2:
                arr = arr.view(np.uint16)
                dt = _core.bfloat16
            else:
                dt = _core.to_dtype(arr.dtype)
            if not arr.flags.c_contiguous:
                c = np.ascontiguousarray(arr)
                self.writeback.append((arr, c))
                arr = c
            st = _core.Storage(arr.reshape(-1), dt, _core.shared_hbm, owner=a)
            return NkiTensor(st, arr.shape, _core._contig(arr.shape), 0)
        if _is_torch(a):
            from . import _torch_bridge

            if self.torch_device is None:
                self.torch_device = a.device
                _torch_bridge.synchronize(a.device)
            return _torch_bridge.from_torch(a)
        if isinstance(a, (list, tuple)):
            return type(a)(self.to_nki(x) for x in a)
        return a

    def from_nki(self, r):
        if isinstance(r, NkiTensor):
            if r.buffer.on_chip:
                raise NkiError("a kernel must return HBM tensors, not SBUF/PSUM tiles")
            owner = r.storage.owner
            if owner is not None and r.offsets is None and r.storage.parent is None:
                if _is_torch(owner):
                    if tuple(owner.shape) == r.shape and tuple(owner.stride()) == r.strides \
                            and owner.storage_offset() == r.offset:
                        return owner
                    return owner.as_strided(r.shape, r.strides, r.offset)
                elif isinstance(owner, np.ndarray) and owner.shape == r.shape and r.offset == 0 \
                        and r.is_contiguous() and owner.flags.c_contiguous:
                    return owner  # an argument the kernel returns (in place): the caller's own array
            if r.dtype is _core.bfloat16:
                vals = r.dtype.decode(r.raw())
                if _core._ml is not None:
                    return r.raw().copy().view(_core._ml.bfloat16)
                return np.array(vals, dtype=np.float32)  # no ml_dtypes: bf16 values as fp32
            return np.array(r.raw())
        if isinstance(r, (list, tuple)):
            return type(r)(self.from_nki(x) for x in r)
        if isinstance(r, dict):
            return {k: self.from_nki(v) for k, v in r.items()}
        return r

    def finish(self):
        for orig, c in self.writeback:
            np.copyto(orig, c)


_SCALARS = (bool, int, float, str, type(None))
_TORCH_TYPES = set()  # the tensor types _is_torch accepted, so a call checks a type once
_blas_checked = False


def _limit_numpy_blas_threads():
    """Run numpy's OpenBLAS on ``NKI_NUMPY_BLAS_THREADS`` threads (default 1; 0 leaves it alone), once, at the
    first kernel launch. The interpreter's nc_matmul is a small numpy matmul per instruction; OpenBLAS's own
    spinning threads contend with PyTorch's OpenMP pool (which runs the device's kernels): a 512x512x1024 fp32
    tiled matmul kernel took 736-762 ms with OpenBLAS's default threads and 31-35 ms with one, on 2 CPUs."""
    global _blas_checked
    if _blas_checked:
        return
    _blas_checked = True
    n = int(os.environ.get("NKI_NUMPY_BLAS_THREADS", "1") or 0)
    if n <= 0:
        return
    try:
        import ctypes

        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and line.split()[-1].startswith("/")}
        for path in paths:
            lib = ctypes.CDLL(path)
            for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                         "openblas_set_num_threads64_", "openblas_set_num_threads"):
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn(ctypes.c_int(n))
                    break
    except Exception:  # noqa: BLE001 - no /proc, another BLAS: leave the library as it is
        pass


class Kernel:
    """An ``@nki.jit`` kernel. ``kernel(args)`` runs one instance; ``kernel[g]`` / ``kernel[g, h]`` a grid."""

    def __init__(self, fn, grid=(), simulate=False, **options):
        self.fn = fn
        self.grid = tuple(grid)
        self.simulate = simulate
        self.options = options
        self._target = options.get("platform_target")
        functools.update_wrapper(self, fn)
        g = getattr(fn, "__globals__", None)
        if g is not None:  # the older API's bare buffer names resolve inside kernels, as in the NKI compiler
            for k, v in _BUILTIN_NAMES.items():
                g.setdefault(k, v)

    def __getitem__(self, grid):
        if not isinstance(grid, tuple):
            grid = (grid,)
        return Kernel(self.fn, tuple(int(g) for g in grid), self.simulate, **self.options)

    def __repr__(self):
        return f"<nki kernel {getattr(self.fn, '__name__', self.fn)} grid={self.grid}>"

    def _fast_key(self, args, kwargs):
        """The plan key computed straight from torch tensors and plain scalars (no numpy views), or None.
        Every replayed call pays for it (a few us per tensor): keep it to attribute reads and tuples."""
        parts = []
        dev = None
        tensors = []
        for a in (args if not kwargs else tuple(args) + tuple(kwargs[k] for k in sorted(kwargs))):
            ta = type(a)
            if ta in _SCALARS:
                parts.append((ta, a))
            elif ta in _TORCH_TYPES or _is_torch(a):
                _TORCH_TYPES.add(ta)
                d = a.device
                if dev is None:
                    dev = d
                elif d != dev:
                    return None, None, None
                parts.append((a.dtype, a.shape, a.stride(), a.storage_offset(), a.untyped_storage().nbytes()))
                tensors.append(a)
            elif ta is _core.DType:
                parts.append(("D", a.name))
            else:
                return None, None, None
        if dev is None:
            return None, None, None
        return (self.fn, self.grid, _compile.env("NEURON_PLATFORM_TARGET_OVERRIDE", b"NEURON_PLATFORM_TARGET_OVERRIDE"), self._target, dev,
                tuple(sorted(kwargs)) if kwargs else (), tuple(parts)), tensors, dev

    def __call__(self, *args, **kwargs):
        outer = _core.current()
        if outer is not None:  # a kernel called from a kernel: plain function call in the same instance
            return self.fn(*args, **kwargs)
        fkey = None
        if not self.simulate and _compile.enabled():
            fkey, tensors, dev = self._fast_key(args, kwargs)
            plan = _compile._FAST.get(fkey) if fkey is not None else None
            if plan is not None:  # replay with torch tensors only: no numpy views, no NkiTensors
                if dev.type != "cpu":
                    _torch_bridge.sync_fn()()
                result = plan.run_torch(tensors, dev)
                _compile.bump("compiled_calls")
                return result
        _limit_numpy_blas_threads()
        conv = _Args()
        nargs = [conv.to_nki(a) for a in args]
        nkw = {k: conv.to_nki(v) for k, v in kwargs.items()}
        target = _core.resolve_target(self.options.get("platform_target"))
        # The fast path serves kernels called with torch tensors; numpy arrays and nki.simulate run the interpreter.
        fast = conv.torch_device is not None and not self.simulate and _compile.enabled()
        key = _compile.plan_key(self, nargs, nkw, target, conv.torch_device) if fast else None
        plan = _compile._PLANS.get(key) if key is not None else None
        if plan is not None and plan is not _compile._INTERPRET:
            if fkey is not None:
                _compile._FAST[fkey] = plan
            try:
                result = plan.run(nargs, nkw, conv.torch_device)
            finally:
                conv.finish()
            _compile.bump("compiled_calls")
            return conv.from_nki(result)
        trace = None
        if key is not None and plan is None and _core.TRACE is None:
            trace = _compile.Trace(getattr(self.fn, "__name__", str(self.fn)))
            for t in _compile._tensors(list(nargs) + [nkw[k] for k in sorted(nkw)], []):
                trace.add_arg(t)
        launch = _core.Launch(target, conv.torch_device)
        result = None
        grid = self.grid or ()
        try:
            _core.TRACE = trace
            for pid in itertools.product(*[range(g) for g in grid]) if grid else [()]:
                inst = _core.Instance(launch, pid, grid)
                _core.set_current(inst)
                try:
                    result = self.fn(*nargs, **nkw)
                finally:
                    _core.set_current(None)
        finally:
            _core.TRACE = None
            conv.finish()
        _compile.bump("interpreted_calls")
        if trace is not None:
            _compile.bump("traces")
            plan = trace.finalize(result)
            if plan is None:
                _compile.bump("fallbacks", (trace.name, trace.bad))
            _compile._PLANS[key] = plan if plan is not None else _compile._INTERPRET
            if plan is not None and fkey is not None:
                _compile._FAST[fkey] = plan
        return conv.from_nki(result)


def jit(fn=None, **kwargs):
    """``@nki.jit`` / ``@nki.jit(platform_target="trn2", mode=...)``: options are accepted; ``platform_target``
    selects the SBUF capacity (trn1 192 KiB, trn2 224 KiB, trn3 256 KiB per partition)."""
    if fn is None:
        return lambda f: Kernel(f, **kwargs)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, **kwargs)


def simulate(kernel, *args, **kwargs):
    """``nki.simulate(kernel)(args)``: run in simulation on numpy (torch tensors are used through their memory).
    The older form ``nki.simulate_kernel(kernel, *args)`` is ``simulate(kernel, *args)``."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    k = Kernel(k.fn, k.grid, True, **k.options)
    if args or kwargs:
        return k(*args, **kwargs)
    return k


simulate_kernel = simulate


def compile_stats():
    """The fast path's counters: ``traces`` (first calls of a new signature, interpreted while recording),
    ``compiled_calls`` (replayed in C), ``interpreted_calls`` and ``fallbacks`` ((kernel, reason) of each
    signature that stays interpreted), ``fused_groups`` (row-blocked runs replayed, NKI_FUSE=1)."""
    return {k: (list(v) if isinstance(v, list) else v) for k, v in _compile.stats.items()}


def reset_compile_cache():
    """Forget every traced kernel and zero compile_stats()."""
    _compile.reset()
benchmark = jit
baremetal = jit
profile = jit
trace = jit
