"""Core of the NKI interpreter: dtypes, memory regions, tensors (strided views over a flat storage) and the
per-instance hardware model (SBUF/PSUM capacity, partition limit).

Everything here runs eagerly on numpy. Values are kept in the storage format of their dtype (bf16 as the upper
16 bits of fp32, in uint16 storage) and rounded on every write; compute reads them as fp32.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import weakref

import numpy as np

try:  # optional: fp8 dtypes and bf16 numpy arrays at the API boundary
    import ml_dtypes as _ml
except ImportError:  # pragma: no cover - depends on the environment
    _ml = None

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


# ----------------------------------------------------------------------------------------------- errors
class NkiError(Exception):
    """A kernel broke a hardware limit or an API rule. The message names the limit, the value and the
    kernel's source file:line."""


def user_location() -> str:
    """file:line of the innermost frame outside the nki package: the kernel line that issued the call."""
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_PKG_DIR):
            return f"{f.f_code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>:0"


def error(msg: str) -> NkiError:
    return NkiError(f"{user_location()}: {msg}")


def limit_error(limit: str, value, maximum) -> NkiError:
    return NkiError(f"{user_location()}: {limit} exceeded: {value} > {maximum}")


# ----------------------------------------------------------------------------------------------- dtypes
def _bf16_encode(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)  # stays a (quiet) NaN
    return r


def _bf16_decode(r: np.ndarray) -> np.ndarray:
    return (np.asarray(r, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _tf32_round(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    r = ((u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isnan(x), x, r)


class DType:
    """An NKI dtype. Compares equal to its name, the numpy dtype and the torch dtype of the same name."""

    def __init__(self, name: str, storage, kind: str):
        self.name = name
        self.storage = np.dtype(storage)
        self.kind = kind  # 'f' float, 'i' signed, 'u' unsigned, 'b' bool
        self.itemsize = self.storage.itemsize

    def __repr__(self):
        return f"nl.{self.name}"

    def __str__(self):
        return self.name

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        if isinstance(other, DType):
            return other.name == self.name
        try:
            return to_dtype(other) is self
        except (TypeError, ValueError, NkiError):
            return False

    @property
    def dtype(self):
        """The numpy dtype of the values (``np.dtype(nl.float16)`` works): bf16 is ml_dtypes' if installed,
        else float32."""
        if self.name == "bfloat16":
            return np.dtype(_ml.bfloat16) if _ml is not None else np.dtype(np.float32)
        return self.storage if self.kind != "b" else np.dtype(bool)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    def decode(self, raw: np.ndarray) -> np.ndarray:
        """Storage values -> compute values (fp32 for floats, the integer type itself for ints)."""
        if self.name == "bfloat16":
            return _bf16_decode(raw)
        if self.kind == "f" and self.storage != np.float32:
            return np.asarray(raw).astype(np.float32)
        return np.asarray(raw)

    def encode(self, values) -> np.ndarray:
        """Compute values -> storage values, rounded to this dtype (round to nearest even for floats)."""
        v = np.asarray(values)
        if self.name == "bfloat16":
            return _bf16_encode(v)
        if self.name == "tfloat32":
            return _tf32_round(v)
        if self.kind == "f":
            with np.errstate(over="ignore", invalid="ignore"):
                return v.astype(self.storage)
        if self.kind == "b":
            return (v != 0).astype(self.storage)
        if v.dtype.kind == "f":  # float -> int: round to nearest, saturate (in float64: fp32 has no int32 max)
            info = np.iinfo(self.storage)
            with np.errstate(invalid="ignore"):
                v = np.clip(np.nan_to_num(np.rint(v.astype(np.float64)), nan=0.0), float(info.min), float(info.max))
                if self.storage == np.int64:  # 2^63 - 1 is no float64: the float64 bound 2^63 casts to int64 min
                    big = v >= 2.0 ** 63
                    if big.any():
                        out = v.astype(np.int64)
                        out[big] = info.max
                        return out
        return v.astype(self.storage)


_DTYPES = {}


def _reg(name, storage, kind):
    d = DType(name, storage, kind)
    _DTYPES[name] = d
    return d


bool_ = _reg("bool_", np.uint8, "b")
int8 = _reg("int8", np.int8, "i")
int16 = _reg("int16", np.int16, "i")
int32 = _reg("int32", np.int32, "i")
int64 = _reg("int64", np.int64, "i")
uint8 = _reg("uint8", np.uint8, "u")
uint16 = _reg("uint16", np.uint16, "u")
uint32 = _reg("uint32", np.uint32, "u")
float16 = _reg("float16", np.float16, "f")
float32 = _reg("float32", np.float32, "f")
bfloat16 = _reg("bfloat16", np.uint16, "f")
tfloat32 = _reg("tfloat32", np.float32, "f")
if _ml is not None:
    float8_e4m3 = _reg("float8_e4m3", _ml.float8_e4m3fn, "f")  # no inf on either format; same grid of values
    float8_e4m3fn = _reg("float8_e4m3fn", _ml.float8_e4m3fn, "f")
    float8_e5m2 = _reg("float8_e5m2", _ml.float8_e5m2, "f")
else:  # pragma: no cover
    float8_e4m3 = float8_e4m3fn = float8_e5m2 = None
_ALIASES = {"bool": "bool_", "float": "float32", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
            "float8_e4m3fnuz": "float8_e4m3fn", "float8_e5m2fnuz": "float8_e5m2"}


def to_dtype(d) -> DType:
    if isinstance(d, DType):
        return d
    if d is None:
        raise error("dtype is required")
    name = None
    if isinstance(d, str):
        name = d
    else:
        s = str(d)
        if s.startswith("torch."):
            name = s[len("torch."):]
        else:
            try:
                name = np.dtype(d).name
            except TypeError:
                name = getattr(d, "name", None) or getattr(d, "__name__", None)
    name = _ALIASES.get(name, name)
    if name not in _DTYPES or _DTYPES[name] is None:
        raise error(f"unsupported dtype {d!r}")
    return _DTYPES[name]


def promote(*dtypes: DType) -> DType:
    """Result dtype of an elementwise op on tiles: the widest float if any float, else the widest int."""
    ds = [d for d in dtypes if d is not None]
    floats = [d for d in ds if d.kind == "f"]
    if floats:
        if any(d is float32 or d is tfloat32 for d in floats):
            return float32
        if all(d is floats[0] for d in floats):
            return floats[0]
        return float32
    if not ds:
        return float32
    return max(ds, key=lambda d: d.itemsize)


# ----------------------------------------------------------------------------------------------- buffers
class Buffer:
    """A memory region. Called like the older API's bare buffer names: ``sbuf.view(dtype=, shape=)``."""

    def __init__(self, name: str, on_chip: bool):
        self.name = name
        self.on_chip = on_chip

    def __repr__(self):
        return f"nl.{self.name}"

    def view(self, dtype, shape, name=""):
        return allocate(tuple(shape), to_dtype(dtype), self)

    def __call__(self, *a, **k):  # nl.sbuf / nl.psum used as a buffer factory in some older kernels
        return self


sbuf = Buffer("sbuf", True)
psum = Buffer("psum", True)
private_hbm = Buffer("private_hbm", False)
hbm = private_hbm
shared_hbm = Buffer("shared_hbm", False)


def to_buffer(b) -> Buffer:
    if isinstance(b, Buffer):
        return b
    name = getattr(b, "value", None) or getattr(b, "name", None) or str(b)
    name = {"hbm": "private_hbm"}.get(name, name)
    for buf in (sbuf, psum, private_hbm, shared_hbm):
        if buf.name == name:
            return buf
    raise error(f"unknown buffer {b!r}")


class ParDim(int):
    """``nl.par_dim(n)``: marks the partition dimension of an on-chip shape."""


# ----------------------------------------------------------------------------------------------- targets
PMAX = 128
PSUM_BANKS = 8
PSUM_BANK_BYTES = 2048
SBUF_BYTES = {"trn1": 192 * 1024, "inf2": 192 * 1024, "gen2": 192 * 1024,
              "trn2": 224 * 1024, "gen3": 224 * 1024, "trn3": 256 * 1024, "gen4": 256 * 1024}


def resolve_target(platform_target=None) -> str:
    t = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or platform_target or "trn2"
    t = str(t).lower()
    if t not in SBUF_BYTES:
        raise NkiError(f"unknown platform_target {t!r}; expected one of {sorted(SBUF_BYTES)}")
    return t


# ----------------------------------------------------------------------------------------------- instances
class Instance:
    """One SPMD program instance: its grid position, and the on-chip memory it has allocated."""

    def __init__(self, launch, pid, grid):
        self.launch = launch
        self.pid = pid
        self.grid = grid
        self.sbuf_cap = SBUF_BYTES[launch.target]
        self.used = {"sbuf": 0, "psum": 0}
        self.shared_idx = 0

    def release(self, region, nbytes):
        self.used[region] -= nbytes


class Launch:
    """One kernel call: the target, the framework of the arguments, and the HBM outputs shared by instances."""

    def __init__(self, target, torch_device=None):
        self.target = target
        self.torch_device = torch_device
        self.shared = []  # shared HBM tensors, by order of allocation in an instance


_tls = threading.local()
# The nki._compile.Trace recording the running kernel, or None. Direct reads and writes of tensor values
# outside a lowered instruction (a value read back into Python, an instruction without a lowering) mark the
# trace as not lowerable. Per thread (two threads may run kernels at once): ``_core.TRACE`` reads and sets this
# thread's trace through the module class below; code in this module calls _trace().


def _trace():
    return getattr(_tls, "trace", None)


class _CoreModule(type(sys)):
    @property
    def TRACE(self):
        return getattr(_tls, "trace", None)

    @TRACE.setter
    def TRACE(self, tr):
        _tls.trace = tr


sys.modules[__name__].__class__ = _CoreModule


def current() -> Instance | None:
    return getattr(_tls, "inst", None)


def set_current(inst):
    _tls.inst = inst


def _fill_value(dtype: DType):
    return np.nan if dtype.kind == "f" else 4  # AWS's simulator: NaN for floats, 4 for integers


class Storage:
    __slots__ = ("flat", "dtype", "buffer", "owner", "acc", "parent", "__weakref__")

    def __init__(self, flat, dtype, buffer, owner=None, parent=None):
        self.parent = parent  # a reinterpreting view keeps the allocation (and its accounting) alive
        self.flat = flat
        self.dtype = dtype
        self.buffer = buffer
        self.owner = owner  # the numpy array / torch tensor whose memory this is
        self.acc = None  # PSUM: per element, whether a matmul accumulation group is open


def _new_hbm(shape, dtype: DType, launch: Launch | None):
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if launch is not None and launch.torch_device is not None:
        import torch

        from . import _torch_bridge

        t = torch.empty(tuple(shape), dtype=_torch_bridge.torch_dtype(dtype), device=launch.torch_device)
        st = _torch_bridge.storage_of(t, dtype)
        st.flat[...] = dtype.encode(np.full(1, _fill_value(dtype), dtype=np.float32 if dtype.is_float else np.int64))[0]
        return NkiTensor(st, tuple(shape), _contig(shape), t.storage_offset())
    flat = np.empty(n, dtype=dtype.storage)
    flat[...] = dtype.encode(np.full(1, _fill_value(dtype), dtype=np.float32 if dtype.is_float else np.int64))[0]
    return NkiTensor(Storage(flat, dtype, shared_hbm, None), tuple(shape), _contig(shape), 0)


def allocate(shape, dtype: DType, buffer, fill="poison"):
    buffer = to_buffer(buffer)
    shape = tuple(int(s) if not isinstance(s, ParDim) else s for s in shape)
    for s in shape:
        if int(s) < 0:
            raise error(f"negative dimension in shape {shape}")
    inst = current()
    if not buffer.on_chip:
        if inst is not None:
            launch = inst.launch
            # Every instance of the grid executes the same allocation: they share the tensor.
            if inst.shared_idx < len(launch.shared):
                t = launch.shared[inst.shared_idx]
                inst.shared_idx += 1
                if t.shape != tuple(int(s) for s in shape) or t.dtype is not dtype:
                    raise error("SPMD instances allocated different HBM tensors")
                return t
            t = _new_hbm(tuple(int(s) for s in shape), dtype, launch)
            launch.shared.append(t)
            inst.shared_idx += 1
            if _trace() is not None:
                _trace().on_alloc(t, fill)
                fill = None  # its fill is recorded with the allocation
        else:
            t = _new_hbm(tuple(int(s) for s in shape), dtype, None)
        if fill == "zeros":
            tr = _trace()
            if tr is not None:
                tr.inside += 1  # the zero fill is a step of its own (recorded below)
                try:
                    t.write(np.zeros(1, np.float32))
                finally:
                    tr.inside -= 1
                tr.on_fill(t, 0)
            else:
                t.write(np.zeros(1, np.float32))
        return t
    # on-chip: partition dim (the par_dim-marked one, else the first) <= 128; per-partition bytes counted.
    pidx = next((i for i, s in enumerate(shape) if isinstance(s, ParDim)), 0)
    shape = tuple(int(s) for s in shape)
    p = shape[pidx] if shape else 1
    if p > PMAX:
        raise limit_error("partition dimension (nl.tile_size.pmax)", p, PMAX)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    # Block dimensions before a par_dim (the older API's (blocks, par_dim(P), F) tensors) are counted as one
    # block: the compiler's allocator rotates the blocks of a loop through a few physical buffers.
    per_part = int(np.prod(shape[pidx + 1:], dtype=np.int64)) * dtype.itemsize if p else 0
    if inst is not None:
        region = buffer.name
        if region == "sbuf":
            if inst.used["sbuf"] + per_part > inst.sbuf_cap:
                raise limit_error(f"SBUF capacity per partition ({inst.launch.target}, bytes)",
                                  inst.used["sbuf"] + per_part, inst.sbuf_cap)
        else:
            cap = PSUM_BANKS * PSUM_BANK_BYTES
            if inst.used["psum"] + per_part > cap:
                raise limit_error("PSUM capacity per partition (8 banks x 2 KiB, bytes)",
                                  inst.used["psum"] + per_part, cap)
        inst.used[region] += per_part
    flat = np.empty(n, dtype=dtype.storage)
    if fill == "zeros":
        flat[...] = 0
    else:
        flat[...] = dtype.encode(np.full(1, _fill_value(dtype), dtype=np.float32 if dtype.is_float else np.int64))[0]
    st = Storage(flat, dtype, buffer)
    if buffer is psum:
        st.acc = np.zeros(n, dtype=bool)
    if inst is not None and per_part:
        weakref.finalize(st, inst.release, buffer.name, per_part)
    t = NkiTensor(st, shape, _contig(shape), 0)
    tr = _trace()
    if tr is not None:
        tr.on_alloc(t, fill)
    return t


def _contig(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= int(s)
    return tuple(reversed(strides))


# ----------------------------------------------------------------------------------------------- tensors
class DynSlice:
    """``nl.ds(start, size)``."""

    def __init__(self, start, size, step=1):
        self.start, self.size, self.step = int(start), int(size), int(step)


def _is_index_array(k):
    return isinstance(k, np.ndarray) and k.ndim > 0


class NkiTensor:
    """A tensor in HBM, SBUF or PSUM: a strided view (element strides) over a flat storage, or, after indexing
    with index arrays (``nl.arange``/``nl.mgrid``), a gathered view with explicit element offsets."""

    __array_priority__ = 1000  # so that numpy scalars/arrays defer to our operators

    def __init__(self, storage: Storage, shape, strides, offset, offsets=None, oob=None):
        self.storage = storage
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        self.offsets = offsets  # gathered view: int64 array of element offsets (shape == self.shape)
        self.oob = oob  # gathered view: which offsets are out of bounds (checked on access under a mask)

    # -- properties
    @property
    def dtype(self) -> DType:
        return self.storage.dtype

    @property
    def buffer(self) -> Buffer:
        return self.storage.buffer

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"NkiTensor(shape={self.shape}, dtype={self.dtype}, buffer={self.buffer})"

    # -- raw access
    def _check_bounds(self):
        if self.offsets is not None or self.size == 0:
            return
        lo = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.strides) if s < 0)
        hi = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.strides) if s > 0)
        if lo < 0 or hi >= self.storage.flat.size:
            raise error(f"access out of bounds of a {self.buffer.name} tensor: elements {lo}..{hi} of "
                        f"{self.storage.flat.size}")

    def _view_of(self, flat):
        """A numpy view of ``flat`` (same element layout as the storage) through this tensor's strides."""
        item = flat.itemsize
        return np.lib.stride_tricks.as_strided(flat[self.offset:], shape=self.shape,
                                               strides=tuple(s * item for s in self.strides))

    def _gather_offsets(self, mask):
        offs = self.offsets
        sel = None
        if mask is not None:
            sel = np.broadcast_to(np.asarray(mask, dtype=bool), self.shape)
        oob = self.oob if sel is None else (self.oob & sel)
        if oob is not None and oob.any():
            raise error(f"index out of bounds of a {self.buffer.name} tensor of {self.storage.flat.size} "
                        "elements (use mask= to skip out-of-range elements)")
        return offs, sel

    def raw(self, mask=None):
        tr = _trace()
        if tr is not None and tr.inside == 0:
            tr.fail(f"a {self.buffer.name} tensor read outside a lowered instruction")
        if self.offsets is not None:
            offs, sel = self._gather_offsets(mask)
            out = self.storage.flat[np.where(self.oob, 0, offs)]
            return out
        if self.size == 0:
            return np.empty(self.shape, self.storage.flat.dtype)
        return self._view_of(self.storage.flat)

    def read(self, mask=None) -> np.ndarray:
        """Values as compute arrays (fp32 for float dtypes)."""
        if self.buffer is psum and self.storage.acc is not None:
            self._close_acc(mask)
        return self.dtype.decode(self.raw(mask))

    def _close_acc(self, mask=None):
        # Reading a PSUM tile (to evacuate it) ends its accumulation group: the next matmul overwrites.
        if self.offsets is not None:
            offs, sel = self._gather_offsets(mask)
            self.storage.acc[offs if sel is None else offs[sel]] = False
        elif self.size:
            self._view_of(self.storage.acc)[...] = False

    def write(self, values, mask=None):
        """Store values, rounded to this tensor's dtype."""
        tr = _trace()
        if tr is not None and tr.inside == 0:
            tr.fail(f"a {self.buffer.name} tensor written outside a lowered instruction")
        v = np.asarray(values)
        if v.shape != self.shape:
            try:
                v = np.broadcast_to(v, self.shape)
            except ValueError:
                v = _reshape_like(v, self.shape)
        enc = self.dtype.encode(v)
        if self.offsets is not None:
            offs, sel = self._gather_offsets(mask)
            if sel is None:
                self.storage.flat[offs] = enc
            else:
                self.storage.flat[offs[sel]] = enc[sel]
            return
        if self.size == 0:
            return
        v = self._view_of(self.storage.flat)
        if mask is None:
            v[...] = enc
        else:
            sel = np.broadcast_to(np.asarray(mask, dtype=bool), self.shape)
            v[sel] = enc[sel]

    def acc_view(self):
        if self.offsets is not None:
            return None
        return self._view_of(self.storage.acc)

    # -- indexing
    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - n_real) + key[i + 1:]
        n_real = sum(1 for k in key if k is not None)
        if n_real > self.ndim:
            raise error(f"too many indices ({n_real}) for a tensor of shape {self.shape}")
        key = key + (slice(None),) * (self.ndim - n_real)
        if self.offsets is not None:
            raise error("indexing a gathered (index-array) view again is not supported")
        if any(_is_index_array(k) or isinstance(k, NkiIndexLike) for k in key):
            return self._gather(key)
        shape, strides, off, d = [], [], self.offset, 0
        for k in key:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            n, s = self.shape[d], self.strides[d]
            d += 1
            if isinstance(k, DynSlice):
                k = slice(k.start, k.start + k.size * k.step, k.step)
            if isinstance(k, slice):
                step = 1 if k.step is None else int(k.step)
                if step <= 0:
                    raise error(f"slice step must be positive, got {step}")
                start = 0 if k.start is None else int(k.start)
                stop = n if k.stop is None else int(k.stop)
                if start < 0 or stop > n or start > stop:
                    raise error(f"slice [{start}:{stop}] out of bounds for dimension {d - 1} of size {n} "
                                f"(shape {self.shape})")
                cnt = max(0, -(-(stop - start) // step))
                off += start * s
                shape.append(cnt)
                strides.append(s * step)
            else:
                i = int(k)
                if i < 0 or i >= n:
                    raise error(f"index {i} out of bounds for dimension {d - 1} of size {n} (shape {self.shape})")
                off += i * s
        return NkiTensor(self.storage, shape, strides, off)

    def _gather(self, key):
        arrays, d = [], 0
        offs = np.int64(self.offset)
        oob = np.zeros((), dtype=bool)
        for k in key:
            if k is None:
                continue
            n, s = self.shape[d], self.strides[d]
            d += 1
            if isinstance(k, (slice, DynSlice)):
                raise error("mixing slices with index arrays (nl.arange/nl.mgrid) is not supported; "
                            "index every dimension with an index array or an integer")
            idx = np.asarray(k).astype(np.int64)
            oob = oob | (idx < 0) | (idx >= n)
            offs = offs + idx * s
        shape = np.broadcast(offs, oob).shape
        offs = np.broadcast_to(offs, shape).copy()
        oob = np.broadcast_to(oob, shape).copy()
        return NkiTensor(self.storage, shape, _contig(shape), 0, offsets=offs, oob=oob)

    def _same_view(self, other):
        return (isinstance(other, NkiTensor) and other.storage is self.storage and other.offsets is None
                and self.offsets is None and other.shape == self.shape and other.strides == self.strides
                and other.offset == self.offset)

    def __setitem__(self, key, value):
        from .language import _values

        dst = self[key]
        if dst._same_view(value):  # `t[k] += x` writes the updated view back onto itself
            return
        dst.write(_values(value))

    # -- views (new API)
    def _strided(self, what):
        if self.offsets is not None:
            raise error(f"{what} of a gathered (index-array) view is not supported")

    def permute(self, dims):
        self._strided("permute")
        return NkiTensor(self.storage, [self.shape[i] for i in dims], [self.strides[i] for i in dims], self.offset)

    def transpose(self, *dims):
        if not dims:
            dims = tuple(reversed(range(self.ndim)))
        return self.permute(dims)

    def broadcast(self, dim, size):
        self._strided("broadcast")
        if self.shape[dim] != 1:
            raise error(f"broadcast: dimension {dim} has size {self.shape[dim]}, not 1")
        shape, strides = list(self.shape), list(self.strides)
        shape[dim], strides[dim] = size, 0
        return NkiTensor(self.storage, shape, strides, self.offset)

    def broadcast_to(self, shape):
        self._strided("broadcast_to")
        shape = tuple(shape)
        pad = len(shape) - self.ndim
        src_shape = (1,) * pad + self.shape
        src_str = (0,) * pad + self.strides
        strides = []
        for n, m, s in zip(src_shape, shape, src_str):
            if n == m:
                strides.append(s)
            elif n == 1:
                strides.append(0)
            else:
                raise error(f"cannot broadcast shape {self.shape} to {shape}")
        return NkiTensor(self.storage, shape, strides, self.offset)

    def expand_dim(self, dim):
        self._strided("expand_dim")
        shape, strides = list(self.shape), list(self.strides)
        shape.insert(dim, 1)
        strides.insert(dim, 0)
        return NkiTensor(self.storage, shape, strides, self.offset)

    def squeeze_dim(self, dim):
        self._strided("squeeze_dim")
        if self.shape[dim] != 1:
            raise error(f"squeeze_dim: dimension {dim} has size {self.shape[dim]}, not 1")
        shape, strides = list(self.shape), list(self.strides)
        del shape[dim], strides[dim]
        return NkiTensor(self.storage, shape, strides, self.offset)

    def slice(self, dim, start, end, step=1):
        key = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim, index):
        if isinstance(index, NkiTensor):
            index = int(index.read().reshape(-1)[0])
        key = [slice(None)] * self.ndim
        key[dim] = int(index)
        return self[tuple(key)]

    def is_contiguous(self):
        return self.offsets is None and self.strides == _contig(self.shape)

    def reshape(self, shape, *more):
        if more or isinstance(shape, int):
            shape = (shape,) + tuple(more)
        shape = list(shape)
        if -1 in shape:
            known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
            shape[shape.index(-1)] = self.size // max(known, 1)
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise error(f"cannot reshape {self.shape} to {tuple(shape)}")
        if not self.is_contiguous():
            raise error("reshape of a non-contiguous view is not supported; use .ap() to describe the access")
        return NkiTensor(self.storage, shape, _contig(shape), self.offset)

    def reshape_dim(self, dim, shape):
        new = list(self.shape[:dim]) + list(shape) + list(self.shape[dim + 1:])
        if -1 in shape:
            known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
            new[dim + list(shape).index(-1)] = self.shape[dim] // max(known, 1)
        sub = new[dim:dim + len(shape)]
        strides = list(self.strides[:dim])
        acc = self.strides[dim]
        inner = []
        for n in reversed(sub):
            inner.append(acc)
            acc *= n
        strides += list(reversed(inner)) + list(self.strides[dim + 1:])
        return NkiTensor(self.storage, new, strides, self.offset)

    def flatten_dims(self, start_dim, end_dim):
        self._strided("flatten_dims")
        for i in range(start_dim, end_dim):
            if self.strides[i] != self.strides[i + 1] * self.shape[i + 1]:
                raise error("flatten_dims: the dimensions are not contiguous")
        n = int(np.prod(self.shape[start_dim:end_dim + 1], dtype=np.int64))
        shape = list(self.shape[:start_dim]) + [n] + list(self.shape[end_dim + 1:])
        strides = list(self.strides[:start_dim]) + [self.strides[end_dim]] + list(self.strides[end_dim + 1:])
        return NkiTensor(self.storage, shape, strides, self.offset)

    def get_pattern(self):
        return [[s, n] for s, n in zip(self.strides, self.shape)]

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
        """An access pattern ``[[stride, count], ...]`` (element strides) from this view's start."""
        self._strided("ap")
        base = self if dtype is None else self.view(dtype)
        off = base.offset + (int(offset) if offset is not None else 0)
        if scalar_offset is not None:
            so = scalar_offset.read().reshape(-1)[0] if isinstance(scalar_offset, NkiTensor) else scalar_offset
            off += int(so) * (base.strides[indirect_dim] if base.ndim else 1)
        if vector_offset is not None:
            raise error("vector_offset indirection in .ap() is not supported yet")
        t = NkiTensor(base.storage, [int(c) for _, c in pattern], [int(s) for s, _ in pattern], off)
        t._check_bounds()
        return t

    def view(self, dtype=None, shape=None):
        """Reinterpret the storage as ``dtype`` (same bytes); with ``shape`` (older API) a reshaped view."""
        t = self
        if dtype is not None:
            dt = to_dtype(dtype)
            if dt is not self.dtype:
                if not self.is_contiguous():
                    raise error("view(dtype) of a non-contiguous view is not supported")
                old, new = self.dtype.itemsize, dt.itemsize
                st = self.storage
                nbytes_off = self.offset * old
                if nbytes_off % new or (self.shape and (self.shape[-1] * old) % new):
                    raise error(f"view as {dt}: the bytes do not divide into {new}-byte elements")
                flat = st.flat.view(np.uint8).view(dt.storage)
                nst = Storage(flat, dt, st.buffer, st.owner, parent=st)
                shape2 = list(self.shape[:-1]) + [self.shape[-1] * old // new] if self.shape else [1]
                t = NkiTensor(nst, shape2, _contig(shape2), nbytes_off // new)
        if shape is not None:
            t = t.reshape(tuple(shape))
        return t

    # -- arithmetic (the tile API): delegates to nki.language
    def _bin(self, other, name, reverse=False):
        from . import language as nl

        op = getattr(nl, name)
        return op(other, self) if reverse else op(self, other)

    def __add__(self, o): return self._bin(o, "add")
    def __radd__(self, o): return self._bin(o, "add", True)
    def __sub__(self, o): return self._bin(o, "subtract")
    def __rsub__(self, o): return self._bin(o, "subtract", True)
    def __mul__(self, o): return self._bin(o, "multiply")
    def __rmul__(self, o): return self._bin(o, "multiply", True)
    def __truediv__(self, o): return self._bin(o, "divide")
    def __rtruediv__(self, o): return self._bin(o, "divide", True)
    def __pow__(self, o): return self._bin(o, "power")
    def __lt__(self, o): return self._bin(o, "less")
    def __le__(self, o): return self._bin(o, "less_equal")
    def __gt__(self, o): return self._bin(o, "greater")
    def __ge__(self, o): return self._bin(o, "greater_equal")
    def __and__(self, o): return self._bin(o, "bitwise_and")
    def __or__(self, o): return self._bin(o, "bitwise_or")
    def __xor__(self, o): return self._bin(o, "bitwise_xor")

    def __neg__(self):
        from . import language as nl

        return nl.negative(self)

    def _inplace(self, o, name):
        from . import language as nl

        vals = getattr(nl, name).fn(self.read(), nl._values(o))
        self.write(vals)
        return self

    def __iadd__(self, o):
        if self.buffer is psum and getattr(o, "_matmul_result", False):
            return self._accumulate(o)
        return self._inplace(o, "add")

    def _accumulate(self, o):
        """``psum_tile += matmul(...)``: a Tensor Engine accumulation (the first write of a group overwrites)."""
        res = np.asarray(o.read(), np.float32).reshape(self.shape)
        acc = self.storage.acc
        open_ = acc[self.offsets] if self.offsets is not None else self.acc_view()
        old = self.dtype.decode(self.raw())
        self.write(np.where(open_, old + res, res))
        if self.offsets is not None:
            acc[self.offsets] = True
        else:
            self.acc_view()[...] = True
        return self
    def __isub__(self, o): return self._inplace(o, "subtract")
    def __imul__(self, o): return self._inplace(o, "multiply")
    def __itruediv__(self, o): return self._inplace(o, "divide")

    __hash__ = object.__hash__


class NkiIndexLike:
    """Marker base for index expression objects (none besides numpy arrays at the moment)."""


def _reshape_like(values, shape):
    v = np.asarray(values)
    if v.size == int(np.prod(shape, dtype=np.int64)):
        return v.reshape(shape)
    raise error(f"cannot store values of shape {v.shape} into a tile of shape {tuple(shape)}")


def as_tensor(x) -> NkiTensor:
    if isinstance(x, NkiTensor):
        return x
    raise error(f"expected an NKI tensor, got {type(x).__name__}")


def elements_per_partition(t: NkiTensor) -> int:
    return int(np.prod(t.shape[1:], dtype=np.int64)) if t.ndim > 1 else 1


math = math  # re-export for helpers
