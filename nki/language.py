"""``nki.language`` (``nl``): dtypes, buffers, tensor creation, index helpers, loops, SPMD ids and the tile API
(``nl.load``/``nl.store``/``nl.add``/``nl.matmul``/...). Tile results are new SBUF tiles (PSUM for matmul)."""

from __future__ import annotations

import builtins
import math as _math

import numpy as np

from . import _compile, _core
from ._core import (DType, DynSlice, NkiTensor, ParDim, allocate, bfloat16, bool_, error, float16,  # noqa: F401
                    float32, float8_e4m3, float8_e4m3fn, float8_e5m2, hbm, int8, int16, int32, int64,
                    limit_error, private_hbm, psum, sbuf, shared_hbm, tfloat32, to_dtype, uint8, uint16, uint32)

_py_abs, _py_max, _py_min, _py_sum, _py_all = builtins.abs, builtins.max, builtins.min, builtins.sum, builtins.all


# ----------------------------------------------------------------------------------------------- constants
class _TileSize:
    pmax = _core.PMAX
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = _core.PSUM_BANK_BYTES
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1
    psum_num_banks = _core.PSUM_BANKS

    def _target_bytes(self):
        inst = _core.current()
        return _core.SBUF_BYTES[inst.launch.target if inst else _core.resolve_target()]

    @property
    def sbuf_size_bytes(self):
        return self._target_bytes() * _core.PMAX

    @property
    def sbuf_fmax_bytes(self):
        return self._target_bytes()

    @property
    def sbuf_fmax(self):
        return self._target_bytes() // 4

    @property
    def total_available_sbuf_size(self):
        return self._target_bytes()


tile_size = _TileSize()


class MemoryRegion:
    sbuf = sbuf
    psum = psum
    private_hbm = private_hbm
    shared_hbm = shared_hbm


def is_hbm(buffer):
    return not _core.to_buffer(buffer).on_chip


def is_on_chip(buffer):
    return _core.to_buffer(buffer).on_chip


def is_psum(buffer):
    return _core.to_buffer(buffer) is psum


def is_sbuf(buffer):
    return _core.to_buffer(buffer) is sbuf


# ----------------------------------------------------------------------------------------------- creation
def par_dim(n):
    return ParDim(int(n))


def ndarray(shape, dtype, buffer=sbuf, name="", address=None, **kw):
    if isinstance(shape, int):
        shape = (shape,)
    return allocate(tuple(shape), to_dtype(dtype), buffer)


def empty_like(x, dtype=None, buffer=None, name="", **kw):
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer)


def zeros(shape, dtype, buffer=sbuf, name="", **kw):
    if isinstance(shape, int):
        shape = (shape,)
    return allocate(tuple(shape), to_dtype(dtype), buffer, fill="zeros")


def zeros_like(x, dtype=None, buffer=None, name="", **kw):
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer)


@_compile.instr
def full(shape, fill_value, dtype, buffer=sbuf, name="", **kw):
    t = ndarray(shape, dtype, buffer)
    t.write(np.asarray(fill_value))
    _compile.record(_compile.rec_store, t, fill_value)
    return t


def ones(shape, dtype, buffer=sbuf, name="", **kw):
    return full(shape, 1, dtype, buffer)


def shared_identity_matrix(n, dtype=uint8, dst=None, **kw):
    t = dst if dst is not None else ndarray((n, n), dtype, sbuf)
    t.write(np.eye(n, dtype=np.float32))
    return t


def shared_constant(constant, dtype=None, **kw):
    arr = np.asarray(constant)
    t = ndarray(arr.shape, dtype or to_dtype(arr.dtype), shared_hbm)
    t.write(arr)
    return t


# ----------------------------------------------------------------------------------------------- indices
def ds(start, size, step=1):
    return DynSlice(start, size, step)


def arange(*args):
    return np.arange(*args)


class _Grid(tuple):
    @property
    def p(self):
        return self[0]

    @property
    def x(self):
        return self[1]

    @property
    def y(self):
        return self[2]

    @property
    def z(self):
        return self[3]


class _MGrid:
    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        return _Grid(np.ogrid[key] if len(key) > 1 else (np.ogrid[key[0]],))


mgrid = _MGrid()


def expand_dims(x, axis):
    if isinstance(x, NkiTensor):
        return x.expand_dim(axis)
    return np.expand_dims(x, axis)


# ----------------------------------------------------------------------------------------------- loops
def _range(start, stop=None, step=1):
    if stop is None:
        start, stop = 0, start
    return range(int(start), int(stop), int(step))


def affine_range(start, stop=None, step=1, **kw):
    return _range(start, stop, step)


def sequential_range(start, stop=None, step=1, **kw):
    return _range(start, stop, step)


def static_range(start, stop=None, step=1, **kw):
    return _range(start, stop, step)


def dynamic_range(start, stop=None, step=1, **kw):
    return _range(start, stop, step)


def fori_loop(lower, upper, body_fun, step=1):
    for i in range(int(lower), int(upper), int(step)):
        body_fun(i)


class no_reorder:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# ----------------------------------------------------------------------------------------------- SPMD
def _inst():
    inst = _core.current()
    if inst is None:
        raise error("nl.program_id/num_programs are only valid inside a running kernel")
    return inst


def program_id(axis=0):
    inst = _inst()
    if axis >= len(inst.grid):
        return 0
    return inst.pid[axis]


def num_programs(axes=None):
    inst = _inst()
    if axes is None:
        return int(np.prod(inst.grid, dtype=np.int64)) if inst.grid else 1
    if isinstance(axes, (tuple, list)):
        return int(np.prod([inst.grid[a] if a < len(inst.grid) else 1 for a in axes], dtype=np.int64))
    return inst.grid[axes] if axes < len(inst.grid) else 1


def program_ndim():
    return len(_inst().grid)


# ----------------------------------------------------------------------------------------------- tile helpers
def _values(x):
    """Compute values of an operand: a tile's values, a numpy array or a scalar."""
    if isinstance(x, NkiTensor):
        if not x.buffer.on_chip:
            raise error("compute engines read SBUF/PSUM tiles, not HBM tensors: load the tensor first "
                        "(nl.load / nisa.dma_copy)")
        return x.read()
    if isinstance(x, (list, tuple)):
        return np.asarray(x)
    return x


def _dtype_of(x):
    if isinstance(x, NkiTensor):
        return x.dtype
    return None


def _result_dtype(dtype, *operands):
    if dtype is not None:
        return to_dtype(dtype)
    return _core.promote(*[_dtype_of(o) for o in operands])


def _check_partition(shape):
    if shape and shape[0] > _core.PMAX:
        raise limit_error("partition dimension (nl.tile_size.pmax)", shape[0], _core.PMAX)


def _new_tile(values, dtype, buffer=sbuf, mask=None):
    values = np.asarray(values)
    _check_partition(values.shape)
    t = allocate(values.shape, to_dtype(dtype), buffer)
    t.write(values, mask=mask)
    return t


def _erf(x):
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), vectorised (numpy has no erf).
    x = np.asarray(x, dtype=np.float64)
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return (s * y).astype(np.float32)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float32)))).astype(np.float32)


def _gelu(x):
    x = np.asarray(x, dtype=np.float32)
    return (0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))).astype(np.float32)


def _gelu_tanh(x):
    x = np.asarray(x, dtype=np.float32)
    return (0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x ** 3)))).astype(np.float32)


def _f32(fn):
    def g(*a):
        with np.errstate(all="ignore"):
            r = fn(*[np.asarray(v, dtype=np.float32) if not (isinstance(v, np.ndarray) and v.dtype.kind in "iub")
                     else v for v in a])
        return r
    return g


class _Op:
    """An ``nl`` operator: callable on tiles (the tile API), and usable as ``op=`` of ``nisa`` instructions."""

    def __init__(self, name, fn, arity, reduce=None, identity=None):
        self.name = name
        self.fn = fn  # numpy implementation on compute values
        self.arity = arity
        self.reduce = reduce  # numpy reduction (for tensor_reduce / nl.sum-like use)
        self.identity = identity

    def __repr__(self):
        return f"nl.{self.name}"

    @_compile.instr
    def __call__(self, *args, dtype=None, mask=None, **kw):
        if self.arity == 1:
            (x,) = args[:1]
            vals = self.fn(_values(x))
            out = _new_tile(vals, _result_dtype(dtype, x), mask=mask)
            _compile.record(_compile.rec_binary_tiles, out, x, None, self, mask)
            return out
        x, y = args[:2]
        a, b = _align_partitions(_values(x), _values(y))
        vals = self.fn(a, b)
        out = _new_tile(vals, _result_dtype(dtype, x, y), mask=mask)
        _compile.record(_compile.rec_binary_tiles, out, x, y, self, mask)
        return out


def _align_partitions(a, b):
    """Tiles broadcast partition-first: a [P] or [P, 1] tile (a free-axis reduction) against a [P, F] tile
    broadcasts along F, not as numpy's trailing-axis rule would."""
    na, nb = np.ndim(a), np.ndim(b)
    if na and nb and na != nb:
        if na < nb and np.shape(a)[0] == np.shape(b)[0]:
            a = np.reshape(a, np.shape(a) + (1,) * (nb - na))
        elif nb < na and np.shape(b)[0] == np.shape(a)[0]:
            b = np.reshape(b, np.shape(b) + (1,) * (na - nb))
    return a, b


def _cmp(fn):
    return lambda a, b: fn(a, b).astype(np.float32)


def _int_or_f32(fn):
    def g(a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind in "iub" and b.dtype.kind in "iub":
            return fn(a, b)
        with np.errstate(all="ignore"):
            return fn(a.astype(np.float32), b.astype(np.float32))
    return g


def _abs_max(a, b):
    return np.maximum(np.abs(a), np.abs(b))


def _abs_min(a, b):
    return np.minimum(np.abs(a), np.abs(b))


add = _Op("add", _int_or_f32(np.add), 2, np.add.reduce, 0.0)
subtract = _Op("subtract", _int_or_f32(np.subtract), 2)
multiply = _Op("multiply", _int_or_f32(np.multiply), 2, np.multiply.reduce, 1.0)
divide = _Op("divide", _f32(np.divide), 2)
maximum = _Op("maximum", _int_or_f32(np.maximum), 2, np.maximum.reduce, -np.inf)
minimum = _Op("minimum", _int_or_f32(np.minimum), 2, np.minimum.reduce, np.inf)
abs_max = _Op("abs_max", _f32(_abs_max), 2, lambda a, axis, keepdims=False: np.max(np.abs(a), axis=axis, keepdims=keepdims))
abs_min = _Op("abs_min", _f32(_abs_min), 2)
power = _Op("power", _f32(np.power), 2)
fmod = _Op("fmod", _f32(np.fmod), 2)
mod = _Op("mod", _f32(np.mod), 2)
equal = _Op("equal", _cmp(np.equal), 2)
not_equal = _Op("not_equal", _cmp(np.not_equal), 2)
less = _Op("less", _cmp(np.less), 2)
less_equal = _Op("less_equal", _cmp(np.less_equal), 2)
greater = _Op("greater", _cmp(np.greater), 2)
greater_equal = _Op("greater_equal", _cmp(np.greater_equal), 2)


def _bits(fn):
    def g(a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            a, b = a.astype(np.int64), b.astype(np.int64)
        return fn(a, b)
    return g


bitwise_and = _Op("bitwise_and", _bits(np.bitwise_and), 2, np.bitwise_and.reduce)
bitwise_or = _Op("bitwise_or", _bits(np.bitwise_or), 2, np.bitwise_or.reduce)
bitwise_xor = _Op("bitwise_xor", _bits(np.bitwise_xor), 2, np.bitwise_xor.reduce)
left_shift = _Op("left_shift", _bits(np.left_shift), 2)
right_shift = _Op("right_shift", _bits(np.right_shift), 2)
logical_and = _Op("logical_and", _cmp(np.logical_and), 2)
logical_or = _Op("logical_or", _cmp(np.logical_or), 2)
logical_xor = _Op("logical_xor", _cmp(np.logical_xor), 2)
invert = _Op("invert", lambda a: np.invert(np.asarray(a).astype(np.int64)), 1)
logical_not = _Op("logical_not", lambda a: np.logical_not(a).astype(np.float32), 1)

exp = _Op("exp", _f32(np.exp), 1)
log = _Op("log", _f32(np.log), 1)
sqrt = _Op("sqrt", _f32(np.sqrt), 1)
rsqrt = _Op("rsqrt", _f32(lambda a: 1.0 / np.sqrt(a)), 1)
tanh = _Op("tanh", _f32(np.tanh), 1)
sigmoid = _Op("sigmoid", _sigmoid, 1)
relu = _Op("relu", _f32(lambda a: np.maximum(a, np.float32(0))), 1)
gelu = _Op("gelu", _gelu, 1)
gelu_apprx_tanh = _Op("gelu_apprx_tanh", _gelu_tanh, 1)
gelu_apprx_sigmoid = _Op("gelu_apprx_sigmoid", _f32(lambda a: a * _sigmoid(np.float32(1.702) * a)), 1)
gelu_dx = _Op("gelu_dx", _f32(lambda a: 0.5 * (1 + _erf(a / np.sqrt(2.0))) + a * np.exp(-0.5 * a * a) / np.sqrt(2 * np.pi)), 1)
silu = _Op("silu", _f32(lambda a: a * _sigmoid(a)), 1)
silu_dx = _Op("silu_dx", _f32(lambda a: _sigmoid(a) * (1 + a * (1 - _sigmoid(a)))), 1)
softplus = _Op("softplus", _f32(lambda a: np.logaddexp(np.float32(0), a)), 1)
mish = _Op("mish", _f32(lambda a: a * np.tanh(np.logaddexp(np.float32(0), a))), 1)
erf = _Op("erf", _erf, 1)
erf_dx = _Op("erf_dx", _f32(lambda a: 2.0 / np.sqrt(np.pi) * np.exp(-a * a)), 1)
reciprocal = _Op("reciprocal", _f32(lambda a: 1.0 / a), 1)
copy = _Op("copy", lambda a: np.asarray(a), 1)
identity = copy
bypass = _Op("bypass", lambda a, b=None: np.asarray(a), 1)
sin = _Op("sin", _f32(np.sin), 1)
cos = _Op("cos", _f32(np.cos), 1)
tan = _Op("tan", _f32(np.tan), 1)
arctan = _Op("arctan", _f32(np.arctan), 1)
ceil = _Op("ceil", _f32(np.ceil), 1)
floor = _Op("floor", _f32(np.floor), 1)
trunc = _Op("trunc", _f32(np.trunc), 1)
negative = _Op("negative", lambda a: np.negative(a), 1)
sign = _Op("sign", _f32(np.sign), 1)
abs = _Op("abs", lambda a: np.abs(a), 1)
square = _Op("square", _f32(np.square), 1)
average = _Op("average", _f32(lambda a, b: (a + b) / 2), 2,
              lambda a, axis, keepdims=False: np.mean(a, axis=axis, keepdims=keepdims))


# ----------------------------------------------------------------------------------------------- load/store
@_compile.instr
def load(src, dtype=None, mask=None, **kw):
    if not isinstance(src, NkiTensor):
        raise error(f"nl.load expects a tensor, got {type(src).__name__}")
    vals = src.dtype.decode(src.raw(mask)) if src.offsets is not None or mask is not None else src.read()
    t = _new_tile(vals, dtype or src.dtype, mask=mask)
    _compile.record(_compile.rec_load, t, src, mask)
    return t


@_compile.instr
def store(dst, value, mask=None, **kw):
    if not isinstance(dst, NkiTensor):
        raise error(f"nl.store expects a destination tensor, got {type(dst).__name__}")
    dst.write(_values(value), mask=mask)
    _compile.record(_compile.rec_store, dst, value, mask)


@_compile.instr
def load_transpose2d(src, dtype=None, mask=None, **kw):
    vals = src.read(mask)
    t = _new_tile(np.asarray(vals).T, dtype or src.dtype)
    if src.ndim == 2:  # a mask changes no value read (an index array out of bounds there is not lowered)
        _compile.record(lambda tr: tr.copy(tr.opd(t, write=True), tr.opd(src).transpose2d()))
    return t


# ----------------------------------------------------------------------------------------------- reductions
def _axis(axis):
    if isinstance(axis, (list, tuple)):
        return tuple(int(a) for a in axis)
    return int(axis)


def _reduce(fn, name):
    @_compile.instr
    def r(x, axis, dtype=None, keepdims=False, mask=None, **kw):
        v = np.asarray(_values(x))
        if v.dtype.kind not in "iub":
            v = v.astype(np.float32)
        out = fn(v, axis=_axis(axis), keepdims=keepdims)
        t = _new_tile(out, _result_dtype(dtype, x))
        _compile.record(_compile.rec_nl_reduce, t, x, name, axis, mask)
        return t
    r.__name__ = r.__qualname__ = name
    return r


sum = _reduce(np.sum, "sum")
max = _reduce(np.max, "max")
min = _reduce(np.min, "min")
mean = _reduce(np.mean, "mean")
prod = _reduce(np.prod, "prod")
var = _reduce(np.var, "var")


def all(x, axis, dtype=None, **kw):
    return _new_tile(np.all(np.asarray(_values(x)) != 0, axis=_axis(axis)).astype(np.float32), dtype or bool_)


@_compile.instr
def softmax(x, axis=-1, dtype=None, **kw):
    v = np.asarray(_values(x), dtype=np.float32)
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    t = _new_tile(e / e.sum(axis=axis, keepdims=True), _result_dtype(dtype, x))
    _compile.record(_compile.rec_softmax, t, x, axis)
    return t


@_compile.instr
def rms_norm(x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None, **kw):
    v = np.asarray(_values(x), dtype=np.float32)
    ms = np.sum(v * v, axis=axis, keepdims=True) / np.float32(n)
    t = _new_tile(v / np.sqrt(ms + np.float32(epsilon)) * _values(w), _result_dtype(dtype, x))
    _compile.record(_compile.rec_rms_norm, t, x, w, axis, n, epsilon)
    return t


@_compile.instr
def where(condition, x, y, dtype=None, mask=None, **kw):
    c = np.asarray(_values(condition)) != 0
    t = _new_tile(np.where(c, _values(x), _values(y)), _result_dtype(dtype, x, y))
    _compile.record(_compile.rec_select, t, condition, x, y)
    return t


@_compile.instr
def transpose(x, dtype=None, mask=None, **kw):
    v = np.asarray(_values(x))
    t = _new_tile(v.reshape(v.shape[0], -1).T, _result_dtype(dtype, x))
    if mask is None:
        _compile.record(_compile.rec_transpose, t, x)
    return t


@_compile.instr
def broadcast_to(x, shape, dtype=None, **kw):
    t = _new_tile(np.broadcast_to(_values(x), tuple(shape)), _result_dtype(dtype, x))
    _compile.record(_compile.rec_copy, t, x)
    return t


def dropout(x, rate, dtype=None, mask=None, **kw):
    v = np.asarray(_values(x), dtype=np.float32)
    r = float(np.asarray(_values(rate)).reshape(-1)[0]) if not np.isscalar(rate) else float(rate)
    keep = np.random.random(v.shape) >= r
    return _new_tile(np.where(keep, v / (1.0 - r) if r < 1 else 0.0, 0.0), _result_dtype(dtype, x))


def rand(shape, dtype=float32, buffer=sbuf, **kw):
    return _new_tile(np.random.random(tuple(shape)).astype(np.float32), dtype, buffer)


def random_seed(seed, **kw):
    np.random.seed(int(np.asarray(_values(seed)).reshape(-1)[0]) if not np.isscalar(seed) else int(seed))


@_compile.instr
def matmul(x, y, transpose_x=False, mask=None, **kw):
    """``x @ y`` (or ``x.T @ y``) on the Tensor Engine, into a new fp32 PSUM tile."""
    from . import isa

    xv, yv = np.asarray(_values(x), np.float32), np.asarray(_values(y), np.float32)
    if not transpose_x:
        if xv.ndim != 2:
            raise error(f"nl.matmul: x must be 2D, got shape {xv.shape}")
        m, k = xv.shape
        if m > _core.PMAX:
            raise limit_error("nl.matmul stationary free dimension (gemm_stationary_fmax)", m, 128)
        xv = xv.T
    isa._check_matmul(xv.shape, yv.shape)
    out = xv.T @ yv
    t = _new_tile(out, float32, psum)
    t._matmul_result = True
    _compile.record(_compile.rec_nl_matmul, t, x, y, transpose_x)  # the product is whole with a mask too
    return t


def device_print(prefix, tensor, **kw):
    v = tensor.read() if isinstance(tensor, NkiTensor) else tensor
    print(prefix, v)


def static_assert(cond, msg=""):
    if not cond:
        raise error(f"static_assert failed: {msg}")


def spmd_dim(*sizes):
    """``nl.spmd_dim(n, nl.nc(2))``: a grid dimension of n x 2 programs (logical cores run as programs)."""
    return int(np.prod([int(s) for s in sizes], dtype=np.int64))


def nc(n):
    return int(n)


def static_cast(x, dtype):
    """Cast a numpy array to ``dtype`` (rounded); bf16 gives an ml_dtypes array when available, else fp32."""
    dt = to_dtype(dtype)
    enc = dt.encode(np.asarray(x, dtype=np.float32) if dt.kind == "f" else np.asarray(x))
    if dt is bfloat16:
        if _core._ml is not None:
            return enc.view(_core._ml.bfloat16)
        return _core._bf16_decode(enc)
    return enc
