"""The fast path: an NKI kernel traced once per argument signature into a list of library steps, replayed in C.

The first call for a key (kernel function, grid, target, each argument's dtype/shape/strides/offset, the other
arguments' values, torch device) runs the interpreter as usual while every instruction records itself, with
its operands resolved to (region, byte offset, shape, element strides, dtype). NKI kernels cannot branch on
tensor values (the hardware compiler traces them too), so the list is the kernel for every call with that key.
Later calls hand the list and the argument addresses to ``torch_neuronx._C._nki_exec`` (csrc/kernels/
nki_exec.c), which calls the kernel library (copies, element-wise, reductions, GEMM) step by step.

Anything the lowering does not know - an instruction without a lowering, a value read back into Python, a
float64 or float16 intermediate of an integer chain - marks the key "interpret": those calls keep running the interpreter,
which stays the reference. ``nki.compile_stats()`` counts replayed and interpreted calls and says why a
signature fell back.

The fast path is on by default for kernels called with torch tensors; ``NKI_COMPILE=0`` turns it off. Kernels
called with numpy arrays, or through ``nki.simulate``, always run the interpreter (simulation).
"""

from __future__ import annotations

import functools
import os
import threading
import weakref

import numpy as np

from . import _core

# nk_dtype codes (neuron_kernels.h)
_NK = {"bool_": 0, "uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float16": 6, "bfloat16": 7, "float32": 8,
       "uint16": 10, "uint32": 11}
_F32 = 8
_FLOAT_NAMES = ("float32", "bfloat16", "float16")
FILL, COPY, UNARY, BINARY, GEMM, REDUCE, COPY_IF, INT = range(8)
# NKX_INT (neuron_kernels.h, nkx_iop): integer arithmetic, compares and casts with the interpreter's numpy rules
_IOP = {"copy": 0, "bypass": 0, "add": 1, "subtract": 2, "multiply": 3, "maximum": 4, "minimum": 5, "bitwise_and": 6,
        "bitwise_or": 7, "bitwise_xor": 8, "left_shift": 9, "right_shift": 10, "equal": 11, "not_equal": 12,
        "less": 13, "less_equal": 14, "greater": 15, "greater_equal": 16, "logical_and": 17, "logical_or": 18,
        "logical_xor": 19, "negative": 20, "abs": 21, "invert": 22, "logical_not": 23, "divide": 24, "sqrt": 25,
        "rsqrt": 26, "reciprocal": 27, "exp": 32, "log": 33, "tanh": 34, "sin": 35, "cos": 36, "tan": 37,
        "arctan": 38, "ceil": 39, "floor": 40, "trunc": 41, "sign": 42, "square": 43, "relu": 44, "power": 45,
        "mod": 46, "fmod": 47}
_I_ARITH = ("add", "subtract", "multiply", "maximum", "minimum")  # nl's _int_or_f32: ints as ints, else fp32
_I_BITS = ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift")
_I_CMP = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or",
          "logical_xor", "logical_not")
# computed in numpy's float result dtype (fp16/fp32/fp64): divide, sqrt, rsqrt, reciprocal correctly rounded
# there (bitwise numpy's); the math functions are <math.h>'s (double for float64, float for fp32 and for fp16,
# whose numpy loops compute in float), within a few ulps of numpy's own loops, which may be SIMD ones; mod,
# fmod, ceil, floor, trunc, sign, square, relu are exact there, bitwise
_I_MATH = ("exp", "log", "tanh", "sin", "cos", "tan", "arctan", "ceil", "floor", "trunc", "sign", "square", "relu",
           "power", "mod", "fmod")
_I_FLOAT = ("divide", "sqrt", "rsqrt", "reciprocal") + _I_MATH
# numpy keeps the integer dtype for these (np.power and np.mod of two integer tiles, np.square wraps)
_I_INTMATH = ("power", "mod", "fmod", "ceil", "floor", "trunc", "sign", "square")
_F_DOM = {"float16": 6, "float32": _F32, "float64": 9}
_I_SCALAR, _I_REVERSE = 1 << 8, 1 << 9
_INT_NAMES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
_UNARY = {"negative": 0, "abs": 1, "exp": 2, "log": 3, "sqrt": 4, "rsqrt": 5, "reciprocal": 6, "sin": 7, "cos": 8,
          "tanh": 9, "sigmoid": 10, "silu": 11, "gelu": 12, "gelu_apprx_tanh": 13, "relu": 14}
_BINARY = {"add": (0, 1.0), "subtract": (0, -1.0), "multiply": (1, 1.0), "divide": (2, 1.0), "equal": (5, 1.0),
           "not_equal": (6, 1.0), "less": (7, 1.0), "less_equal": (8, 1.0), "greater": (9, 1.0),
           "greater_equal": (10, 1.0), "logical_and": (11, 1.0), "logical_or": (12, 1.0), "logical_xor": (13, 1.0),
           "power": (17, 1.0), "maximum": (18, 1.0), "minimum": (19, 1.0)}
_COPY_OPS = ("copy", "bypass")
_REDUCE = {"add": 0, "sum": 0, "mean": 1, "maximum": 2, "max": 2, "minimum": 3, "min": 3}
MAX_DIMS = 6

_OP_DT = np.dtype([("region", "<i4"), ("dtype", "<i4"), ("ndim", "<i4"), ("pad", "<i4"), ("offset", "<i8"),
                   ("sizes", "<i8", (MAX_DIMS,)), ("strides", "<i8", (MAX_DIMS,))])
_INS_DT = np.dtype([("kind", "<i4"), ("op", "<i4"), ("nops", "<i4"), ("flags", "<i4"), ("value", "<f8"),
                    ("o", _OP_DT, (3,))])

stats = {"traces": 0, "compiled_calls": 0, "interpreted_calls": 0, "fallbacks": [], "fused_groups": 0}
_PLANS = {}
_FAST = {}  # the same plans keyed from the torch arguments themselves (nki/__init__.py: Kernel._fast_key)
_LOCK = threading.Lock()  # the counters (plans are set and read whole: a dict item is atomic under the GIL)
_INTERPRET = "interpret"
_exec = None  # torch_neuronx._C._nki_exec, once loaded; False when unavailable


_ENV = getattr(os.environ, "_data", None)  # os.environ's own dict (bytes keys): os.environ.get costs ~1.5 us


def env(name: str, bname: bytes):
    """os.environ.get(name) without its encode/decode round trip (every replayed call reads two variables)."""
    if _ENV is None or os.name != "posix":
        return os.environ.get(name)
    v = _ENV.get(bname)
    return None if v is None else os.fsdecode(v)


def enabled() -> bool:
    return env("NKI_COMPILE", b"NKI_COMPILE") != "0" and _executor() is not None


def _executor():
    global _exec
    if _exec is None:
        try:
            from torch_neuronx import _C

            lay = list(_C._nki_exec_layout())
            if lay != [_INS_DT.itemsize, _OP_DT.itemsize, _INS_DT.fields["o"][1]]:
                raise ImportError(f"nkx_instr layout {lay} differs from nki/_compile.py's")
            _exec = _C._nki_exec
        except (ImportError, AttributeError):
            _exec = False
    return _exec or None


def bump(name, item=None):
    with _LOCK:
        if item is None:
            stats[name] += 1
        else:
            stats[name].append(item)


def reset():
    """Forget every plan and zero the counters (tests)."""
    _PLANS.clear()
    _FAST.clear()
    stats.update(traces=0, compiled_calls=0, interpreted_calls=0, fallbacks=[], fused_groups=0)


class Unsupported(Exception):
    pass


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# ----------------------------------------------------------------------------------------------- keys
def _key_of(x):
    if isinstance(x, _core.NkiTensor):
        if x.offsets is not None:
            return None
        return ("T", x.dtype.name, x.shape, x.strides, x.offset, x.storage.flat.size)
    if isinstance(x, (list, tuple)):
        parts = tuple(_key_of(v) for v in x)
        return None if any(p is None for p in parts) else (type(x).__name__, parts)
    if x is None or isinstance(x, (bool, int, float, str, np.integer, np.floating)):
        return (type(x).__name__, x)
    if isinstance(x, _core.DType):
        return ("D", x.name)
    try:
        hash(x)
    except TypeError:
        return None
    return ("O", x)


def plan_key(kernel, nargs, nkw, target, device):
    parts = [_key_of(a) for a in nargs] + [(k, _key_of(v)) for k, v in sorted(nkw.items())]
    if any(p is None or (isinstance(p, tuple) and len(p) == 2 and p[1] is None) for p in parts):
        return None
    try:
        key = (kernel.fn, kernel.grid, target, str(device), tuple(parts))
        hash(key)
    except TypeError:
        return None
    return key


def _tensors(x, out):
    if isinstance(x, _core.NkiTensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _tensors(v, out)
    return out


# ----------------------------------------------------------------------------------------------- shapes
def _contig(shape):
    return _core._contig(shape)


def _view_strides(olds, oldst, news):
    """Strides that view (olds, oldst) as shape news without a copy (numpy's no-copy reshape), or None."""
    if int(np.prod(olds, dtype=np.int64)) != int(np.prod(news, dtype=np.int64)):
        return None
    if int(np.prod(news, dtype=np.int64)) == 0:
        return list(_contig(news))
    od = [(n, s) for n, s in zip(olds, oldst) if n != 1]
    dims = [n for n, _ in od]
    st = [s for _, s in od]
    newst = [0] * len(news)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(news) and oi < len(dims):
        np_, op_ = news[ni], dims[oi]
        while np_ != op_:
            if np_ < op_:
                np_ *= news[nj]
                nj += 1
            else:
                op_ *= dims[oj]
                oj += 1
        for ok in range(oi, oj - 1):
            if st[ok] != dims[ok + 1] * st[ok + 1]:
                return None
        newst[nj - 1] = st[oj - 1]
        for nk in range(nj - 1, ni, -1):
            newst[nk - 1] = newst[nk] * news[nk]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    return newst


class Opd:
    """An operand: a region of the trace, the nk dtype code, shape, element strides and byte offset."""

    __slots__ = ("region", "dt", "shape", "strides", "off", "name")

    def __init__(self, region, dt, shape, strides, off, name):
        self.region, self.dt, self.shape, self.strides, self.off, self.name = \
            region, dt, tuple(shape), tuple(strides), off, name

    def reshape(self, shape):
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return self
        st = _view_strides(self.shape, self.strides, shape)
        if st is None:
            raise Unsupported(f"a view of shape {self.shape} strides {self.strides} as {shape}")
        return Opd(self.region, self.dt, shape, st, self.off, self.name)

    def broadcast(self, shape):
        """numpy broadcasting (trailing dims aligned) to ``shape``."""
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return self
        pad = len(shape) - len(self.shape)
        if pad < 0:
            raise Unsupported(f"broadcast of {self.shape} to {shape}")
        src = (1,) * pad + self.shape
        sst = (0,) * pad + self.strides
        st = []
        for n, m, s in zip(src, shape, sst):
            if n == m:
                st.append(s)
            elif n == 1:
                st.append(0)
            else:
                raise Unsupported(f"broadcast of {self.shape} to {shape}")
        return Opd(self.region, self.dt, shape, st, self.off, self.name)

    def transpose2d(self):
        if len(self.shape) != 2:
            raise Unsupported("transpose of a non-2D operand")
        return Opd(self.region, self.dt, self.shape[::-1], self.strides[::-1], self.off, self.name)

    def byte_range(self):
        es = _core.to_dtype(self.name).itemsize if self.name != "const" else 4
        lo = hi = self.off
        for n, s in zip(self.shape, self.strides):
            if n > 1:
                if s < 0:
                    lo += (n - 1) * s * es
                else:
                    hi += (n - 1) * s * es
        return lo, hi + es


# ----------------------------------------------------------------------------------------------- trace
class Trace:
    def __init__(self, kernel_name):
        self.name = kernel_name
        self.ins = []
        self.inside = 0
        self.recorded = False
        self.bad = None
        self.regions = [{"kind": "const"}]
        self.consts = []
        self.const_idx = {}
        self.by_storage = weakref.WeakKeyDictionary()
        self.nargs = 0
        self.outs = []  # region index of each kernel-allocated HBM tensor, in allocation order

    # -- bookkeeping
    def fail(self, reason):
        if self.bad is None:
            self.bad = f"{_core.user_location()}: {reason}"

    def _new_region(self, kind, **kw):
        self.regions.append(dict(kind=kind, **kw))
        return len(self.regions) - 1

    def add_arg(self, t):
        root = _root(t.storage)
        if root not in self.by_storage:
            self.by_storage[root] = (self._new_region("arg", index=self.nargs), _ptr(root.flat))
        self.nargs += 1

    def on_alloc(self, t, fill):
        """A fresh allocation: an on-chip region (arena bytes) or a kernel HBM output, and its fill."""
        if self.bad is not None:
            return
        st = t.storage
        if st.buffer.on_chip:
            r = self._new_region("chip", nbytes=st.flat.nbytes)
        else:
            r = self._new_region("out", shape=t.shape, dtype=t.dtype, offset=t.offset, nbytes=st.flat.nbytes,
                                 index=len(self.outs))
            self.outs.append(r)
        self.by_storage[st] = (r, _ptr(st.flat))
        if t.size == 0:
            return
        try:
            if fill == "zeros":
                self.fill(t, 0)
            else:
                self.fill(t, _core._fill_value(t.dtype))
        except Unsupported as e:
            self.fail(str(e))

    def on_fill(self, t, value):
        if self.bad is None and t.size:
            try:
                self.fill(t, value)
            except Unsupported as e:
                self.fail(str(e))

    def temp(self, shape, name="float32"):
        dt = _core.to_dtype(name)
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        r = self._new_region("chip", nbytes=n * dt.itemsize)
        return Opd(r, _NK[name], shape, _contig(shape), 0, name)

    def const(self, v, shape):
        v = float(np.float32(v))
        key = np.float32(v).tobytes()
        i = self.const_idx.get(key)
        if i is None:
            i = self.const_idx[key] = len(self.consts)
            self.consts.append(v)
        return Opd(0, _F32, shape, (0,) * len(shape), 4 * i, "const")

    def const_tile(self, vals):
        """A tile of trace-time values (an iota, a select's index predicate) in the constant pool, as fp32:
        values fp32 does not hold exactly are Unsupported."""
        v = np.asarray(vals, dtype=np.float64)
        f = v.astype(np.float32)
        if not np.array_equal(f.astype(np.float64), v, equal_nan=True):
            raise Unsupported("a constant tile fp32 does not hold exactly")
        off = 4 * len(self.consts)
        self.consts.extend(float(x) for x in f.reshape(-1))
        return Opd(0, _F32, v.shape, _contig(v.shape), off, "const")

    def emit(self, kind, ops, op=0, value=0.0, flags=0):
        for o in ops:
            if len(o.shape) > MAX_DIMS:
                raise Unsupported(f"{len(o.shape)} dimensions (the executor takes {MAX_DIMS})")
        self.ins.append((kind, op, float(value), int(flags), ops))
        self.recorded = True

    # -- operands
    def opd(self, t, mask=None, write=False, box=None, keep=None):
        """t as an operand; box (from mask_box) restricts it to the elements a mask keeps; keep (a bool array of
        t's shape) lets an index array go out of bounds where it is False (a masked access never touches those)."""
        if not isinstance(t, _core.NkiTensor):
            raise Unsupported(f"operand of type {type(t).__name__}")
        if mask is not None and not np.all(np.broadcast_to(np.asarray(mask, dtype=bool), t.shape)):
            raise Unsupported("a mask that leaves elements out")
        name = t.dtype.name
        if name == "tfloat32" and not write:
            name = "float32"  # tf32 values are stored as fp32 already rounded: reading them is exact
        if name not in _NK:
            raise Unsupported(f"dtype {t.dtype}")
        root = _root(t.storage)
        ent = self.by_storage.get(root)
        if ent is None:
            raise Unsupported("memory outside the kernel's arguments and allocations")
        region, base = ent
        extra = _ptr(t.storage.flat) - base
        if box is not None and len(box) != len(t.shape):
            raise Unsupported(f"a mask of {len(box)} dims over a tile of {len(t.shape)}")
        if t.offsets is not None:
            offs, oob = t.offsets, t.oob
            if box is not None:
                offs = offs[box]
                oob = oob[box] if oob is not None else None
            if oob is not None and (oob if keep is None or box is not None else oob & keep).any():
                raise Unsupported("an index array out of bounds")
            shape, strides, off = _affine(offs)
        else:
            shape, strides, off = t.shape, t.strides, t.offset
            if box is not None:
                off += sum(b.start * st for b, st in zip(box, strides))
                shape = tuple(b.stop - b.start for b in box)
        return Opd(region, _NK[name], shape, strides, extra + off * t.dtype.itemsize, name)

    @staticmethod
    def mask_box(t, mask):
        """The slices of t a mask keeps when they form a box (a tail tile's rows < n, a column range): None for a
        mask that keeps everything, () for one that keeps nothing; Unsupported otherwise."""
        if mask is None:
            return None
        m = np.broadcast_to(np.asarray(mask, dtype=bool), t.shape)
        if m.all():
            return None
        if not m.any():
            return ()
        box = []
        for d in range(m.ndim):
            idx = np.nonzero(m.any(axis=tuple(a for a in range(m.ndim) if a != d)))[0]
            box.append(slice(int(idx[0]), int(idx[-1]) + 1))
        box = tuple(box)
        if not m[box].all():
            raise Unsupported("a mask that is not a box of the tile")
        return box

    def value_opd(self, x, shape):
        """A compute operand: a tile (broadcast to shape) or a scalar from the constant pool."""
        if isinstance(x, _core.NkiTensor):
            o = self.opd(x)
            if o.name not in _FLOAT_NAMES:
                raise Unsupported(f"compute on {o.name}")
            return o
        if isinstance(x, (bool, int, float, np.integer, np.floating)) or (isinstance(x, np.ndarray) and x.ndim == 0):
            return self.const(float(x), shape)
        raise Unsupported(f"compute operand of type {type(x).__name__}")

    # -- steps
    def fill(self, t, value, box=None):
        d = self.opd(t, write=True, box=box)
        self.emit(FILL, [d], value=_fill_value_of(t, value))

    def copy(self, dst: Opd, src: Opd):
        if src.shape != dst.shape:
            src = src.reshape(dst.shape) if int(np.prod(src.shape, dtype=np.int64)) == int(
                np.prod(dst.shape, dtype=np.int64)) else src.broadcast(dst.shape)
        cast = src.dt != dst.dt and not (src.name in _FLOAT_NAMES + ("const",) and dst.name in _FLOAT_NAMES)
        if src.region == dst.region and src.region != 0 and not (src.off == dst.off and src.strides == dst.strides):
            a, b = src.byte_range(), dst.byte_range()
            if a[0] < b[1] and b[0] < a[1]:  # nk_copy takes no partial overlap: stage through a temporary
                tmp = self.temp(src.shape, src.name)
                self.emit(COPY, [tmp, src])
                src = tmp
        if cast:  # an integer on either side: the interpreter's encoding (wrap, round + saturate, != 0)
            dom = _F32 if src.name in _FLOAT_NAMES + ("const",) else _NK["uint8" if src.name == "bool_" else src.name]
            return self.emit(INT, [dst, src], op=_IOP["copy"], flags=dom)
        self.emit(COPY, [dst, src])

    def apply(self, op, dst: Opd, srcs):
        """dst = op(*srcs) in fp32, rounded once to dst's dtype (srcs already of dst's shape)."""
        name = getattr(op, "name", None)
        if dst.name not in _FLOAT_NAMES:
            raise Unsupported(f"compute into {dst.name}")
        arity = getattr(op, "arity", None)
        if arity == 1 or len(srcs) == 1:
            x = srcs[0]
            if name in _COPY_OPS:
                return self.copy(dst, x)
            if name == "square":
                return self.emit(BINARY, [dst, x, x], op=1)
            if name not in _UNARY:
                raise Unsupported(f"operator {op!r}")
            return self.emit(UNARY, [dst, x], op=_UNARY[name])
        if name not in _BINARY:
            raise Unsupported(f"operator {op!r}")
        code, alpha = _BINARY[name]
        self.emit(BINARY, [dst] + list(srcs), op=code, value=alpha)

    def int_op(self, op, dst, srcs):
        """dst = op(*srcs) as the interpreter's numpy computes it with an integer tile among the operands (or an
        integer dst): srcs are Opds (tiles, of the result's shape) or the raw scalars the interpreter hands op.fn.
        dst None: a new temporary of numpy's result dtype (a chain's intermediate). Returns the destination."""
        name = getattr(op, "name", None)
        if name in _UNARY and name not in _IOP and len(srcs) == 1 and getattr(op, "arity", None) == 1:
            return self.int_f32_unary(op, name, dst, srcs[0])
        if name not in _IOP or getattr(op, "fn", None) is None:
            raise Unsupported(f"operator {op!r} on integer tiles")
        tiles = [x for x in srcs if isinstance(x, Opd)]
        if not tiles or len(srcs) - len(tiles) > 1 or any(o.name == "const" or o.name not in _NK for o in tiles):
            raise Unsupported(f"integer {name} of these operands")

        def probe(x):
            if isinstance(x, Opd):
                return np.zeros(1, np.float32 if x.name in _FLOAT_NAMES else _core.to_dtype(x.name).storage)
            if isinstance(x, np.ndarray) and x.ndim > 0:
                raise Unsupported("an array operand")
            return x

        pr = [probe(x) for x in srcs]
        floats = any(isinstance(x, Opd) and x.name in _FLOAT_NAMES for x in srcs) or any(
            isinstance(x, (float, np.floating)) for x in pr)
        try:
            with np.errstate(all="ignore"):
                res = np.asarray(op.fn(*pr)).dtype
                T = np.result_type(*pr) if name in _I_CMP else pr[0].dtype if name in _COPY_OPS else res
        except (TypeError, ValueError, OverflowError) as e:
            raise Unsupported(f"integer {name}: {e}")
        if T.kind in "iu" and T.name in _INT_NAMES and not (floats and name in _I_BITS + ("invert",)):
            if name in _I_MATH and name not in _I_INTMATH:
                raise Unsupported(f"integer {name} computed in {T}")
            dom = _NK[T.name]
        elif T.kind == "b" and name in _I_CMP:
            dom = _NK["uint8"]
        elif T == np.float32 and name in _I_ARITH + _COPY_OPS + ("negative", "abs"):
            dom = _F32
        elif T.kind == "f" and name in _I_CMP:
            dom = 9  # NK_F64: compares exact in double
        elif name in _I_FLOAT and T.name in _F_DOM:
            dom = _F_DOM[T.name]
        else:
            raise Unsupported(f"integer {name} computed in {T}")
        flags, value = dom, 0.0
        sc = [x for x, o in zip(pr, srcs) if not isinstance(o, Opd)]
        if sc and name in _I_FLOAT:  # nl's _f32: a scalar operand is an fp32 array (an integer array stays), then T
            try:
                a = sc[0]
                v = (a if isinstance(a, np.ndarray) and a.dtype.kind in "iub" else np.asarray(a, np.float32)).astype(T)
            except (TypeError, ValueError, OverflowError) as e:
                raise Unsupported(f"scalar operand: {e}")
            value = float(v)
            flags |= _I_SCALAR | (_I_REVERSE if not isinstance(srcs[0], Opd) else 0)
        elif sc:
            try:
                v = np.asarray(sc[0]).astype(T if dom != _F32 else np.float32)
            except (TypeError, ValueError, OverflowError) as e:
                raise Unsupported(f"scalar operand: {e}")
            if dom not in (_F32, 9) and (int(v) != sc[0] or abs(int(v)) > 2 ** 53):
                raise Unsupported(f"scalar {sc[0]!r} in {T}")
            value = float(v)
            flags |= _I_SCALAR | (_I_REVERSE if not isinstance(srcs[0], Opd) else 0)
        if dst is None:
            if res.name not in _NK or res.name == "float16":  # an fp16 tile reads back as fp32, numpy's would not
                raise Unsupported(f"an intermediate of {res}")
            dst = self.temp(tiles[0].shape, res.name)
        target = dst
        if any(o.region == dst.region and o.region != 0 and _overlap(o, dst, self.regions) and not _same(o, dst)
               for o in tiles):
            target = self.temp(dst.shape, dst.name)  # read every source before the destination is written
        self.emit(INT, [target] + tiles, op=_IOP[name], value=value, flags=flags)
        if target is not dst:
            self.copy(dst, target)
        return dst

    def int_f32_unary(self, op, name, dst, x):
        """An fp32 activation (sigmoid, gelu, silu...) of an integer tile: the interpreter converts the tile to
        fp32 and runs its fp32 function, so the replay converts and runs the float step (within its few ulps)."""
        if not isinstance(x, Opd) or x.name not in _INT_NAMES + ("bool_",) or getattr(op, "fn", None) is None:
            raise Unsupported(f"operator {op!r} of these operands")
        try:
            with np.errstate(all="ignore"):
                T = np.asarray(op.fn(np.zeros(1, _core.to_dtype(x.name).storage))).dtype
        except (TypeError, ValueError, OverflowError) as e:
            raise Unsupported(f"integer {name}: {e}")
        if T != np.float32:
            raise Unsupported(f"integer {name} computed in {T}")
        t = self.temp(x.shape)
        self.copy(t, x)
        if dst is None:
            dst = self.temp(x.shape)
        target = dst if dst.name == "float32" else self.temp(x.shape)
        self.emit(UNARY, [target, t], op=_UNARY[name])
        if target is not dst:
            self.copy(dst, target)
        return dst

    def gemm(self, dst: Opd, a: Opd, b: Opd, accumulate: bool):
        """dst[M, N] (+)= a[M, K] @ b[K, N], fp32 accumulation."""
        if a.dt != _F32:
            t = self.temp(a.shape)
            self.copy(t, a)
            a = t
        if b.dt != _F32:
            t = self.temp(b.shape)
            self.copy(t, b)
            b = t
        if dst.dt == _F32:
            return self.emit(GEMM, [dst, a, b], flags=1 if accumulate else 0)
        t = self.temp(dst.shape)
        self.emit(GEMM, [t, a, b], flags=0)
        if accumulate:
            self.emit(BINARY, [dst, dst, t], op=0, value=1.0)
        else:
            self.copy(dst, t)

    def reduce(self, dst_t, src: Opd, opname, axes, negate=False, mask=None, npfn=None):
        """npfn: the numpy reduction the interpreter calls (its result dtype is an integer reduction's T)."""
        if opname not in _REDUCE:
            raise Unsupported(f"reduction {opname}")
        nd = len(src.shape)
        axes = sorted({int(a) % nd for a in axes})
        keep = tuple(1 if i in axes else n for i, n in enumerate(src.shape))
        dst, fin = out_target(self, dst_t, None, mask)
        if dst is None:
            self.recorded = True
            return
        if src.name in _INT_NAMES + ("bool_",):
            self.int_reduce(dst.reshape(keep), src, opname, axes, negate, npfn)
        else:
            self.reduce_to(dst.reshape(keep), src, opname, axes, keep, negate)
        if fin is not None:
            fin()

    def int_reduce(self, dst, src, opname, axes, negate, npfn):
        """An integer tile reduced as the interpreter's numpy does (NKX_I_RSUM/RMAX/RMIN/RMEAN): the sum wrapped
        to numpy's result dtype, max/min exact, a mean the exact sum over the count in float64."""
        if npfn is None:
            raise Unsupported(f"integer {opname} reduction")
        name = {"add": "sum", "maximum": "max", "minimum": "min"}.get(opname, opname)
        st = _core.to_dtype(src.name).storage
        try:
            with np.errstate(all="ignore"):
                T = np.asarray(npfn(np.zeros((1, 2), st), axis=(1,))).dtype
                if negate:
                    T = np.asarray(-np.zeros(1, T)).dtype
        except (TypeError, ValueError) as e:
            raise Unsupported(f"integer {opname} reduction: {e}")
        cnt = int(np.prod([src.shape[a] for a in axes], dtype=np.int64))
        pairwise = 0
        if name == "mean":
            if T != np.float64:
                raise Unsupported(f"a mean of {src.name} in {T}")
            if src.name == "int64" or cnt > 1 << 21:
                # the float64 sum may round: numpy's order, which the replay follows for a contiguous block of
                # trailing dims (numpy reduces it as one inner loop)
                nd = len(src.shape)
                trailing = axes == list(range(nd - len(axes), nd))
                contig = all(src.strides[a] == int(np.prod(src.shape[a + 1:], dtype=np.int64)) for a in axes)
                if not (trailing and contig):
                    raise Unsupported(f"a mean of {src.name} over dims {axes} that are not contiguous trailing dims")
                pairwise = 1 << 11
            dom = 9
        elif T.name == "uint64" and name == "sum":
            dom = _NK["int64"]  # sums of unsigned values below 2^63: the same bits, the same conversions
            # a negated uint64 sum is near 2^64 as a float (into an integer tile only its low bits count)
            if (negate and dst.name not in _INT_NAMES + ("bool_",)) or cnt * (2 ** 32) >= 2 ** 63:
                raise Unsupported(f"a uint64 sum of {cnt} elements")
        elif T.name in _INT_NAMES or (T.kind == "b" and name != "sum"):
            dom = _NK[T.name] if T.kind != "b" else _NK["bool_"]
        else:
            raise Unsupported(f"integer {opname} reduction into {T}")
        op = {"sum": 28, "max": 29, "min": 30, "mean": 31}[name]
        flags = dom | (1 << 10 if negate else 0) | pairwise | (sum(1 << a for a in axes) << 16)
        if _overlap(src, dst, self.regions) and src.region != 0:
            t = self.temp(dst.shape, dst.name)
            self.emit(INT, [t, src], op=op, flags=flags)
            return self.copy(dst, t)
        self.emit(INT, [dst, src], op=op, flags=flags)

    def reduce_to(self, dst, src, opname, axes, keep, negate):
        if src.name not in _FLOAT_NAMES or dst.name not in _FLOAT_NAMES:
            raise Unsupported(f"reduction of {src.name} into {dst.name}")
        if src.dt != _F32:
            t = self.temp(src.shape)
            self.copy(t, src)
            src = t
        flags = sum(1 << a for a in axes)
        if dst.dt == _F32 and not negate:
            return self.emit(REDUCE, [dst, src], op=_REDUCE[opname], flags=flags)
        t = self.temp(keep)
        self.emit(REDUCE, [t, src], op=_REDUCE[opname], flags=flags)
        if negate:
            self.emit(UNARY, [dst, t], op=_UNARY["negative"])
        else:
            self.copy(dst, t)

    # -- plan
    def finalize(self, result):
        if self.bad is not None:
            return None
        tmpl = _template(result, self)
        if tmpl is None:
            self.bad = "the kernel returns something other than HBM tensors and Python values"
            return None
        if os.environ.get("NKI_COMPILE_OPT", "1") != "0":
            optimize(self)
        return Plan(self, tmpl)


# ----------------------------------------------------------------------------------------------- optimizer
# The recorded steps follow the kernel instruction by instruction: every tile is NaN-filled when allocated, every
# nl.load / dma_copy copies HBM into a tile that one step then reads, every result goes through a tile that one
# copy then stores. On the host these are all memory passes, each ~10 us or more. The passes below remove what
# cannot change the result: reads of a tile that is an exact copy of memory read that memory (load forwarding),
# a result copied unchanged to its destination is written there directly (store forwarding), and a write to a
# tile or fresh output that nothing reads before it is overwritten is dropped. Each works on exact byte sets, and
# anything it cannot prove (argument tensors may alias each other) keeps the step.
def _reads(step):
    kind, _, _, flags, ops = step
    r = list(ops[1:])
    if (kind == GEMM and flags & 1) or kind == COPY_IF:
        r.append(ops[0])
    return r


def _same(a, b):
    return (a.region == b.region and a.off == b.off and a.shape == b.shape and a.strides == b.strides
            and a.dt == b.dt)


def _overlap(a, b, regions):
    if a.region == 0 or b.region == 0:
        return False  # the constant pool is never written
    if a.region != b.region:
        # argument tensors are separate regions but may share memory
        return regions[a.region]["kind"] == "arg" and regions[b.region]["kind"] == "arg"
    if 0 in a.shape or 0 in b.shape:
        return False
    x, y = a.byte_range(), b.byte_range()
    return x[0] < y[1] and y[0] < x[1]


def _mask_view(mask, o):
    es = 4 if o.name == "const" else _core.to_dtype(o.name).itemsize
    return np.ndarray(tuple(o.shape) + (es,), dtype=bool, buffer=mask, offset=o.off,
                      strides=tuple(int(st) * es for st in o.strides) + (1,))


def _forward_loads(ins, regions):
    for i, (kind, _, _, _, ops) in enumerate(ins):
        if kind != COPY:
            continue
        d, src = ops
        if regions[d.region]["kind"] != "chip" or d.dt != src.dt or d.shape != src.shape:
            continue
        for j in range(i + 1, len(ins)):
            k2, op2, v2, f2, ops2 = ins[j]
            w = ops2[0]
            # a step reading src where it writes must do so element by element on the same view (no partial
            # overlap: nk_copy and GEMM take none)
            clash = _overlap(w, src, regions) and not (_same(w, src) and k2 in (COPY, UNARY, BINARY, INT))
            new = list(ops2)
            for n in range(1, len(ops2)):
                if _same(ops2[n], d) and not clash:
                    new[n] = src
            if new != list(ops2):
                ins[j] = (k2, op2, v2, f2, new)
            if _overlap(w, d, regions) or _overlap(w, src, regions):
                break


def _forward_stores(ins, regions):
    i = 0
    while i < len(ins):
        kind, _, _, _, ops = ins[i]
        if kind != COPY or regions[ops[1].region]["kind"] != "chip" or ops[0].dt != ops[1].dt \
                or ops[0].shape != ops[1].shape or regions[ops[0].region]["kind"] == "const":
            i += 1
            continue
        h, d = ops
        ok = False
        p = i - 1
        while p >= 0:  # the step that produced d, with nothing touching d or h in between
            pk, pop, pv, pf, pops = ins[p]
            if _same(pops[0], d):
                ok = pk in (FILL, COPY, UNARY, BINARY, REDUCE, INT) or (pk == GEMM and not pf & 1)
                break
            if _overlap(pops[0], d, regions) or _overlap(pops[0], h, regions) or \
                    any(_overlap(r, d, regions) or _overlap(r, h, regions) for r in _reads(ins[p])):
                break
            p -= 1
        if ok:  # the producer must not read h other than element-wise in place
            for r in _reads(ins[p]):
                if _overlap(r, h, regions) and not (_same(r, h) and ins[p][0] in (COPY, UNARY, BINARY, INT)):
                    ok = False
        if ok:  # and nothing may read d after the copy before d is rewritten whole
            for j in range(i + 1, len(ins)):
                if any(_overlap(r, d, regions) for r in _reads(ins[j])):
                    ok = False
                    break
                if _same(ins[j][4][0], d):
                    break
        if ok:
            pk, pop, pv, pf, pops = ins[p]
            ins[p] = (pk, pop, pv, pf, [h] + list(pops[1:]))
            del ins[i]
            continue
        i += 1


def _drop_dead(ins, regions):
    touching = {}
    for j, st in enumerate(ins):
        for o in [st[4][0]] + _reads(st):
            touching.setdefault(o.region, []).append(j)
    dead = set()
    for i, st in enumerate(ins):
        w = st[4][0]
        reg = regions[w.region]
        if reg["kind"] not in ("chip", "out") or 0 in w.shape:
            continue
        try:
            pending = np.zeros(reg["nbytes"], dtype=bool)
            _mask_view(pending, w)[...] = True
        except (ValueError, TypeError):
            continue
        verdict = reg["kind"] == "chip"  # nothing reads it before the end: dead on chip, live in an output
        try:
            for j in sorted(set(touching.get(w.region, ()))):
                if j <= i or j in dead:
                    continue
                if any(r.region == w.region and _mask_view(pending, r).any() for r in _reads(ins[j])):
                    verdict = False
                    break
                _mask_view(pending, ins[j][4][0])[...] = False
                if not pending.any():
                    verdict = True
                    break
        except (ValueError, TypeError):
            verdict = False
        if verdict:
            dead.add(i)
    ins[:] = [st for j, st in enumerate(ins) if j not in dead]
    return bool(dead)


def _itemsize(o):
    return 4 if o.name == "const" else _core.to_dtype(o.name).itemsize


def _injective(o):
    """True when no two elements of o share bytes (dims sorted by stride, each past the extent of the smaller)."""
    es = _itemsize(o)
    dims = sorted((abs(s) * es, n) for n, s in zip(o.shape, o.strides) if n > 1)
    extent = es
    for st, n in dims:
        if st < extent:
            return False
        extent = st * (n - 1) + extent
    return True


_EXACT_MAX = 1 << 22  # elements of an operand checked address by address (trace time only)


def _disjoint(a, b, regions):
    """True when a and b provably share no bytes (the byte sets compared where the bounding boxes overlap)."""
    if not _overlap(a, b, regions):
        return True
    if a.region != b.region:
        return False  # two arguments that may alias
    na, nb = int(np.prod(a.shape, dtype=np.int64)), int(np.prod(b.shape, dtype=np.int64))
    if na > _EXACT_MAX or nb > _EXACT_MAX:
        return False

    def starts(o):
        es = _itemsize(o)
        p = np.full((1,), o.off, dtype=np.int64)
        for n, s in zip(o.shape, o.strides):
            p = (p[:, None] + np.arange(n, dtype=np.int64)[None, :] * (s * es)).reshape(-1)
        return p
    ea, eb = _itemsize(a), _itemsize(b)
    xa, xb = np.sort(starts(a)), starts(b)
    i = np.searchsorted(xa, xb - ea + 1)  # the first element of a that ends after y starts
    hit = i < len(xa)
    return not np.any(xa[np.minimum(i, len(xa) - 1)][hit] < xb[hit] + eb)


_MERGE_KINDS = (FILL, COPY, UNARY, BINARY, REDUCE)


def _merged(s1, s2, regions):
    """s1 and s2 as one step when s2 repeats s1 on the next block of every operand along one dim (the steps of
    consecutive affine_range iterations or SPMD programs over adjacent tiles), else None. The merged step must
    give what s1 then s2 give: the destinations do not overlap (the merged destination is injective) and
    neither step reads what the other writes."""
    k1, op1, v1, f1, o1 = s1
    k2, op2, v2, f2, o2 = s2
    if k1 != k2 or k1 not in _MERGE_KINDS or op1 != op2 or v1 != v2 or f1 != f2 or len(o1) != len(o2):
        return None
    nd = len(o1[0].shape)
    if nd == 0:
        return None
    for a, b in zip(o1, o2):
        if a.region != b.region or a.dt != b.dt or a.name != b.name or len(a.shape) != nd or len(b.shape) != nd:
            return None
        if 0 in a.shape or 0 in b.shape:
            return None
    for d in range(nd):
        if k1 == REDUCE and f1 >> d & 1:
            continue  # a reduced dim: its blocks sum into one value
        new = []
        for q, (a, b) in enumerate(zip(o1, o2)):
            if any(a.shape[e] != b.shape[e] for e in range(nd) if e != d) or a.strides[d] != b.strides[d]:
                break
            if any(a.strides[e] != b.strides[e] for e in range(nd) if e != d and a.shape[e] > 1):
                break
            step = a.strides[d] * _itemsize(a)
            if b.off - a.off != step * a.shape[d] or (q == 0 and step == 0):
                break
            shape = list(a.shape)
            shape[d] = a.shape[d] + b.shape[d]
            new.append(Opd(a.region, a.dt, shape, a.strides, a.off, a.name))
        else:
            if len(new[0].shape) and not _injective(new[0]):
                continue
            w1, w2 = o1[0], o2[0]
            r1, r2 = _reads(s1), _reads(s2)
            if not all(_disjoint(w1, r, regions) for r in r2) or not all(_disjoint(w2, r, regions) for r in r1):
                continue
            return (k1, op1, v1, f1, new)
    return None


def _merge(ins, regions):
    """Joins runs of steps that repeat one another on adjacent blocks (see _merged) into one step each: an
    SPMD add over [128, 512] tiles of a [512, 2048] tensor becomes one [512, 2048] add, one library call that
    can use the pool instead of 16 single-threaded ones."""
    out = []
    for st in ins:
        m = _merged(out[-1], st, regions) if out else None
        if m is not None:
            out[-1] = m
        else:
            out.append(st)
    changed = len(out) != len(ins)
    ins[:] = out
    return changed


FUSE_NEXT = 1 << 30  # nki_exec.c's NKX_FUSE_NEXT: replay this step and the next one row block by row block


def _rows_apart(a, b, regions):
    """True when row r of a can only share bytes with row r of b (so running both a block of rows at a time
    keeps every dependency)."""
    if not _overlap(a, b, regions):
        return True
    if a.region != b.region or a.off != b.off or not a.shape or not b.shape or a.shape[0] != b.shape[0]:
        return False
    ea = 4 if a.name == "const" else _core.to_dtype(a.name).itemsize
    eb = 4 if b.name == "const" else _core.to_dtype(b.name).itemsize
    sa, sb = a.strides[0] * ea, b.strides[0] * eb
    if sa != sb or sa <= 0:
        return False
    for o in (a, b):
        lo, hi = Opd(o.region, o.dt, (1,) + o.shape[1:], o.strides, o.off, o.name).byte_range()
        if lo < o.off or hi - o.off > sa:
            return False
    return True


_FUSE_DT = (_NK["float32"], _NK["bfloat16"], _NK["float16"])
FUSE_MAX = 32  # nki_exec.c's NKX_FUSE_MAX (a longer run would be split there anyway)


def _fusable(st, rows):
    """A step the fused executor takes (nki_exec.c, nkx_fstep_init): element-wise on float tiles, or a reduce of
    every free dim into one value per row, with rows rows."""
    kind, op, _, flags, ops = st
    if kind not in (COPY, UNARY, BINARY, REDUCE):
        return False
    if not all(1 <= len(o.shape) <= MAX_DIMS and o.shape[0] == rows and o.dt in _FUSE_DT for o in ops):
        return False
    if kind == REDUCE:
        d, s = ops
        return (not flags & 1 and op in (0, 1, 2, 3) and int(np.prod(d.shape[1:], dtype=np.int64)) == 1
                and all(n <= 1 or flags >> a & 1 for a, n in enumerate(s.shape) if a >= 1)
                and (op < 2 or int(np.prod(s.shape[1:], dtype=np.int64)) > 0))
    return all(o.shape == ops[0].shape for o in ops)


def _fuse(ins, regions):
    """Marks runs of element-wise steps and free-axis reduces over the same partition rows with FUSE_NEXT
    (see nki_exec.c): the executor replays such a run a block of rows at a time, intermediates staying in L1.
    Returns the number of runs."""
    groups = 0
    i = 0
    while i < len(ins):
        ops = ins[i][4]
        rows = ops[0].shape[0] if ops and ops[0].shape else None
        if rows is None or rows < 2 or not _fusable(ins[i], rows) or \
                not all(_rows_apart(ops[0], r, regions) for r in _reads(ins[i])):
            i += 1
            continue
        j = i + 1
        while j < len(ins) and j - i < FUSE_MAX and _fusable(ins[j], rows):
            w = ins[j][4][0]
            rd = _reads(ins[j])
            if not all(_rows_apart(w, r, regions) for r in rd):
                break
            ok = True
            for p in range(i, j):
                pw = ins[p][4][0]
                if not (_rows_apart(pw, w, regions) and all(_rows_apart(pw, r, regions) for r in rd)
                        and all(_rows_apart(w, r, regions) for r in _reads(ins[p]))):
                    ok = False
                    break
            if not ok:
                break
            # only a chain: the step reads what the run wrote (independent tiles gain nothing, and pay the blocks)
            if not any(_overlap(ins[p][4][0], r, regions) for p in range(i, j) for r in rd):
                break
            j += 1
        if j - i > 1:
            for p in range(i, j - 1):
                k, op, v, f, o = ins[p]
                ins[p] = (k, op, v, f | FUSE_NEXT, o)
            groups += 1
        i = j
    return groups


JOIN_NEXT = 1 << 29  # nki_exec.c's NKX_JOIN_NEXT: the next fused group shares no bytes with this one
JOIN_MAX = 16  # nki_exec.c's NKX_JOIN_MAX


def _join(ins, span, regions):
    """Marks runs of back-to-back fused groups that share no bytes (each 128-row tile of an rmsnorm is its own
    group) with JOIN_NEXT on each group's last step but the run's last: the executor runs their row blocks in one
    parallel region (one fork/join per call, not one per tile). Returns {group start: run (start, end)}."""
    starts = sorted({g for g in span if g is not None and g[1] > g[0]})
    runs = {}
    k = 0
    while k < len(starts):
        run = [starts[k]]
        ops = [o for i in range(starts[k][0], starts[k][1] + 1) for o in ins[i][4]]
        writes = [ins[i][4][0] for i in range(starts[k][0], starts[k][1] + 1)]
        while k + 1 < len(starts) and len(run) < JOIN_MAX:
            a, b = run[-1], starts[k + 1]
            if b[0] != a[1] + 1 or b[1] - b[0] + 1 > FUSE_MAX or a[1] - a[0] + 1 > FUSE_MAX:
                break
            bops = [o for i in range(b[0], b[1] + 1) for o in ins[i][4]]
            bw = [ins[i][4][0] for i in range(b[0], b[1] + 1)]
            if any(_overlap(w, o, regions) for w in writes for o in bops) or \
                    any(_overlap(w, o, regions) for w in bw for o in ops):
                break
            run.append(b)
            ops += bops
            writes += bw
            k += 1
        k += 1
        if len(run) > 1:
            for g in run[:-1]:
                kd, op, v, f, o = ins[g[1]]
                ins[g[1]] = (kd, op, v, f | JOIN_NEXT, o)
            for g in run:
                runs[g] = (run[0][0], run[-1][1])
    return runs


def _scratch_tiles(tr, span):
    """{(step, operand): slot + 1} for the on-chip tiles only one fused group touches (nki_exec.c, nkx_slots): the
    executor keeps such a tile's current rows in a per-worker scratch block instead of its arena bytes. Every
    access must address rows of one byte stride, each row's bytes within one stride of the lowest offset."""
    touch = {}
    for i, (_, _, _, _, ops) in enumerate(tr.ins):
        for k, o in enumerate(ops):
            if tr.regions[o.region]["kind"] == "chip":
                touch.setdefault(o.region, []).append((i, k, o))
    pads, nslot = {}, {}
    for acc in touch.values():
        g = span[acc[0][0]]
        if g[0] == g[1] or any(span[i] != g for i, _, _ in acc):
            continue
        es = {_core.to_dtype(o.name).itemsize for _, _, o in acc}
        strides = {o.strides[0] * _core.to_dtype(o.name).itemsize for _, _, o in acc}
        if len(strides) != 1 or min(strides) <= 0 or any(s < 0 for _, _, o in acc for s in o.strides[1:]):
            continue
        row = strides.pop()
        lo = min(o.off for _, _, o in acc)
        ext = [o.off - lo + _core.to_dtype(o.name).itemsize * (1 + sum((n - 1) * s for n, s in
                                                                         zip(o.shape[1:], o.strides[1:]) if n > 0))
               for _, _, o in acc]
        slot = nslot.get(g[0], 0)
        if max(ext) > row or slot >= 16 or not es:
            continue
        nslot[g[0]] = slot + 1
        for i, k, _ in acc:
            pads[(i, k)] = slot + 1
    return pads


def optimize(tr):
    ins = [(k, op, v, f, list(ops)) for k, op, v, f, ops in tr.ins]
    _forward_loads(ins, tr.regions)
    _forward_stores(ins, tr.regions)
    for _ in range(4):
        if not _drop_dead(ins, tr.regions):
            break
    if os.environ.get("NKI_MERGE", "1") != "0":
        for _ in range(4):
            if not _merge(ins, tr.regions):
                break
    tr.ins = ins
    # NKI_FUSE=0 replays every step whole (the reference the fused replay is tested against)
    tr.fuse = os.environ.get("NKI_FUSE", "1") != "0"  # done by Plan, before chip tiles get arena offsets


def _root(st):
    while st.parent is not None:
        st = st.parent
    return st


def _affine(offs):
    """(shape, strides, offset) of an index-array view whose element offsets are affine in the index."""
    offs = np.asarray(offs, dtype=np.int64)
    shape = offs.shape
    if offs.size == 0:
        return shape, _contig(shape), 0
    base = int(offs.reshape(-1)[0])
    strides = []
    for d, n in enumerate(shape):
        if n > 1:
            idx = [0] * len(shape)
            idx[d] = 1
            strides.append(int(offs[tuple(idx)]) - base)
        else:
            strides.append(0)
    expect = np.full(shape, base, dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        sh = [1] * len(shape)
        sh[d] = n
        expect = expect + np.arange(n, dtype=np.int64).reshape(sh) * s
    if not np.array_equal(expect, offs):
        raise Unsupported("an index-array access that is not a strided pattern")
    return shape, tuple(strides), base


def _template(r, tr):
    if isinstance(r, _core.NkiTensor):
        if r.offsets is not None or r.buffer.on_chip:
            return None
        ent = tr.by_storage.get(r.storage)
        if ent is None:
            return None
        reg = tr.regions[ent[0]]
        return ("T", reg["kind"], reg.get("index", ent[0]), r.shape, r.strides, r.offset)
    if isinstance(r, (list, tuple)):
        parts = [_template(v, tr) for v in r]
        return None if any(p is None for p in parts) else (type(r), parts)
    if isinstance(r, dict):
        parts = {k: _template(v, tr) for k, v in r.items()}
        return None if any(p is None for p in parts.values()) else (dict, parts)
    if r is None or isinstance(r, (bool, int, float, str)):
        return ("V", r)
    return None


class Plan:
    """A traced kernel: the packed instruction list, the arena layout and how to build the result."""

    def __init__(self, tr: Trace, tmpl):
        self.name = tr.name
        self.template = tmpl
        # Fused groups are found on the tiles as traced (distinct regions never share bytes), and every tile a
        # group touches lives through the whole group: arena reuse inside a group would be a hazard between
        # rows (the executor runs all of a group's steps on a few rows before the next rows).
        self.fused = _fuse(tr.ins, tr.regions) if getattr(tr, "fuse", False) else 0
        span = [None] * len(tr.ins)
        i = 0
        while i < len(tr.ins):
            j = i
            while j + 1 < len(tr.ins) and tr.ins[j][3] & FUSE_NEXT:
                j += 1
            span[i:j + 1] = [(i, j)] * (j + 1 - i)
            i = j + 1
        pads = _scratch_tiles(tr, span) if self.fused else {}
        # Joined groups run at once: every tile of the run lives through the whole run (no arena reuse inside it).
        runs = _join(tr.ins, span, tr.regions) if self.fused and os.environ.get("NKI_JOIN", "1") != "0" else {}
        self.joined = len(runs)
        span = [runs.get(g, g) for g in span]
        # Arena: on-chip regions (tiles and temporaries) live from their first to their last step; a region
        # whose life is over gives its bytes back (first fit, 64-byte aligned).
        first, last = {}, {}
        for i, (_, _, _, _, ops) in enumerate(tr.ins):
            g0, g1 = span[i]
            for o in ops:
                first[o.region] = min(first.get(o.region, g0), g0)
                last[o.region] = max(last.get(o.region, g1), g1)
        ends = {}
        for r, i in last.items():
            ends.setdefault(i, []).append(r)
        starts = {}
        for r, i in first.items():
            starts.setdefault(i, []).append(r)
        free = []  # (offset, size)
        top = 0
        arena_off = {}
        for i in range(len(tr.ins)):
            for r in starts.get(i, ()):
                reg = tr.regions[r]
                if reg["kind"] != "chip":
                    continue
                size = (max(reg["nbytes"], 1) + 63) // 64 * 64
                for j, (off, sz) in enumerate(free):
                    if sz >= size:
                        arena_off[r] = off
                        if sz == size:
                            free.pop(j)
                        else:
                            free[j] = (off + size, sz - size)
                        break
                else:
                    arena_off[r] = top
                    top += size
            for r in ends.get(i, ()):
                reg = tr.regions[r]
                if reg["kind"] == "chip":
                    size = (max(reg["nbytes"], 1) + 63) // 64 * 64
                    free.append((arena_off[r], size))
                    free.sort()
                    merged = []
                    for off, sz in free:
                        if merged and merged[-1][0] + merged[-1][1] == off:
                            merged[-1] = (merged[-1][0], merged[-1][1] + sz)
                        else:
                            merged.append((off, sz))
                    free = merged
        self.arena = np.zeros(top + 64, dtype=np.uint8)
        self.consts = np.asarray(tr.consts or [0.0], dtype=np.float32)
        # final region ids: 0 arena, 1 constants, 2.. arguments, then the kernel's HBM outputs
        self.nargs = tr.nargs
        final = {}
        for r, reg in enumerate(tr.regions):
            if reg["kind"] == "arg":
                final[r] = 2 + reg["index"]
        self.outs = []
        for j, r in enumerate(tr.outs):
            final[r] = 2 + tr.nargs + j
            reg = tr.regions[r]
            self.outs.append((reg["shape"], reg["dtype"], reg["offset"]))
        ins = np.zeros(len(tr.ins), dtype=_INS_DT)
        for i, (kind, op, value, flags, ops) in enumerate(tr.ins):
            rec = ins[i]
            rec["kind"], rec["op"], rec["nops"], rec["flags"], rec["value"] = kind, op, len(ops), flags, value
            for k, o in enumerate(ops):
                reg = tr.regions[o.region]
                if reg["kind"] == "chip":
                    region, off = 0, arena_off[o.region] + o.off
                elif reg["kind"] == "const":
                    region, off = 1, o.off
                else:
                    region, off = final[o.region], o.off
                rec["o"][k]["region"] = region
                rec["o"][k]["pad"] = pads.get((i, k), 0)
                rec["o"][k]["dtype"] = o.dt
                rec["o"][k]["ndim"] = len(o.shape)
                rec["o"][k]["offset"] = off
                rec["o"][k]["sizes"][:len(o.shape)] = o.shape
                rec["o"][k]["strides"][:len(o.shape)] = o.strides
        self.ins = ins
        self.bases = np.zeros(2 + self.nargs + len(self.outs), dtype=np.uint64)
        self.arena_ptr = (_ptr(self.arena) + 63) // 64 * 64
        self.bases[0] = self.arena_ptr
        self.bases[1] = _ptr(self.consts)
        self.steps = len(tr.ins)
        self.lock = threading.Lock()  # one arena and one base table per plan: one replay at a time
        self.ins_ptr, self.bases_ptr = _ptr(self.ins), _ptr(self.bases)
        self.torch_outs = None

    def run_torch(self, tensors, device):
        """Replay on torch tensors (the arguments' tensors in order): returns what the kernel returns, as
        ``_Args.from_nki`` would (an argument or output itself when the view is the whole tensor)."""
        if self.torch_outs is None:
            import torch

            from . import _torch_bridge

            self.torch_empty = torch.empty
            self.torch_outs = [(tuple(shape), _torch_bridge.torch_dtype(dt)) for shape, dt, _ in self.outs]
            t = self.template  # a kernel returning one whole output tensor: that tensor, no template walk
            self.whole_out = None
            if t[0] == "T" and t[1] == "out" and t[5] == 0 and tuple(t[3]) == tuple(self.outs[t[2]][0]) and \
                    tuple(t[4]) == _contig(tuple(t[3])):
                self.whole_out = t[2]
        empty = self.torch_empty
        outs = [empty(shape, dtype=dt, device=device) for shape, dt in self.torch_outs]
        ptrs = [t.untyped_storage().data_ptr() for t in tensors] + [t.untyped_storage().data_ptr() for t in outs]
        with self.lock:
            bases = self.bases
            bases[2:] = ptrs
            _exec(self.ins_ptr, self.steps, self.bases_ptr, len(bases))
        if self.fused:
            stats["fused_groups"] += self.fused
        if self.whole_out is not None:
            return outs[self.whole_out]
        return _build_torch(self.template, tensors, outs)

    def run(self, nargs, nkw, torch_device):
        args = _tensors(list(nargs) + [nkw[k] for k in sorted(nkw)], [])
        if len(args) != self.nargs:
            raise RuntimeError("nki compiled kernel: argument count changed")
        outs = [_new_output(shape, dt, torch_device) for shape, dt, _off in self.outs]
        with self.lock:
            bases = self.bases
            for i, t in enumerate(args):
                bases[2 + i] = _ptr(t.storage.flat)
            for j, t in enumerate(outs):
                bases[2 + self.nargs + j] = _ptr(t.storage.flat)
            _exec(_ptr(self.ins), self.steps, _ptr(bases), len(bases))
        if self.fused:
            stats["fused_groups"] += self.fused
        return _build(self.template, args, outs)


def _build_torch(tmpl, args, outs):
    def leaf(src, shape, strides, offset):
        if tuple(src.shape) == tuple(shape) and tuple(src.stride()) == tuple(strides) and \
                src.storage_offset() == offset:
            return src
        return src.as_strided(shape, strides, offset)
    return _walk(tmpl, args, outs, leaf)


def _new_output(shape, dt, torch_device):
    """An HBM tensor the kernel allocates; its NaN fill is the plan's first step that touches it."""
    if torch_device is not None:
        import torch

        from . import _torch_bridge

        t = torch.empty(tuple(shape), dtype=_torch_bridge.torch_dtype(dt), device=torch_device)
        st = _torch_bridge.storage_of(t, dt)
        return _core.NkiTensor(st, shape, _contig(shape), t.storage_offset())
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return _core.NkiTensor(_core.Storage(np.empty(n, dtype=dt.storage), dt, _core.shared_hbm), shape,
                           _contig(shape), 0)


def _walk(tmpl, args, outs, leaf):
    """The kernel's return value rebuilt from its template: values as traced, tensors through
    leaf(source, shape, strides, offset) with the source an argument or an output."""
    tag = tmpl[0]
    if tag == "V":
        return tmpl[1]
    if tag == "T":
        _, kind, idx, shape, strides, offset = tmpl
        return leaf(args[idx] if kind == "arg" else outs[idx], shape, strides, offset)
    if tag is dict:
        return {k: _walk(v, args, outs, leaf) for k, v in tmpl[1].items()}
    return tag(_walk(v, args, outs, leaf) for v in tmpl[1])


def _build(tmpl, args, outs):
    return _walk(tmpl, args, outs, lambda src, shape, strides, offset: _core.NkiTensor(src.storage, shape, strides,
                                                                                        offset))


# ----------------------------------------------------------------------------------------------- hooks
def instr(fn):
    """Marks an interpreter function as an instruction with a lowering: while tracing, its own reads and
    writes are expected, and it must record its steps (or the trace falls back to interpreting)."""

    @functools.wraps(fn)
    def w(*a, **k):
        tr = _core.TRACE
        if tr is None:
            return fn(*a, **k)
        if tr.inside == 0:
            tr.recorded = False
        tr.inside += 1
        try:
            res = fn(*a, **k)
        finally:
            tr.inside -= 1
        if tr.inside == 0 and not tr.recorded and tr.bad is None:
            tr.fail(f"{fn.__module__}.{fn.__name__} (this form) has no lowering")
        return res

    return w


def record(fn, *args):
    """Runs ``fn(trace, *args)`` if this is the outermost instruction of an active, still lowerable trace."""
    tr = _core.TRACE
    if tr is None or tr.inside != 1 or tr.bad is not None:
        return
    try:
        fn(tr, *args)
    except Unsupported as e:
        tr.fail(str(e))


# ----------------------------------------------------------------------------------------------- lowerings
# Each rec_* runs after the interpreter executed the instruction (so tiles it allocated exist) and records the
# same computation as library steps. They raise Unsupported for anything they do not reproduce exactly.
def out_opd(tr, t, shape, mask=None):
    """The destination of a result of ``shape``: the interpreter reshapes a result of dst's size into dst."""
    return tr.opd(t, mask, write=True).reshape(shape) if tuple(t.shape) != tuple(shape) else tr.opd(t, mask, True)


def _mask_of(t, mask):
    """The mask as a bool array of t's shape, or None when it keeps every element."""
    if mask is None:
        return None
    m = np.broadcast_to(np.asarray(mask, dtype=bool), t.shape)
    return None if m.all() else m


def _pred(tr, m):
    return tr.const_tile(m.astype(np.float64))


def out_target(tr, t, shape, mask=None):
    """(operand, finish) for a result of ``shape`` (None: t's) written to t under a mask: without a partial
    mask t itself and finish None; else a temporary of t's dtype the result is computed into whole, and finish()
    copies the elements the mask keeps into t (NKX_COPY_IF with the mask as a constant predicate tile: any mask
    of index expressions, a triangle too). (None, None) when the mask keeps nothing."""
    if isinstance(t, Opd):
        return t, None
    m = _mask_of(t, mask)
    shape = tuple(t.shape) if shape is None else tuple(shape)
    if m is None:
        return out_opd(tr, t, shape), None
    if not m.any():
        return None, None
    d = tr.opd(t, write=True, keep=m)
    tmp = tr.temp(d.shape, d.name)
    return (tmp.reshape(shape) if shape != tmp.shape else tmp), lambda: tr.emit(COPY_IF, [d, _pred(tr, m), tmp])


def rec_copy(tr, dst, src, mask=None):
    try:
        box = tr.mask_box(dst, mask)
    except Unsupported:
        box = False  # no box: the elements the mask keeps, through a predicate
    if box == ():  # the mask keeps nothing: no step
        tr.recorded = True
        return
    if box is not None and (box is False or isinstance(src, Opd) or tuple(src.shape) != tuple(dst.shape)):
        return rec_copy_masked(tr, dst, src, _mask_of(dst, mask))
    d = tr.opd(dst, write=True, box=box)
    s = src if isinstance(src, Opd) else tr.opd(src, box=box)
    tr.copy(d, s)


def rec_copy_masked(tr, dst, src, m):
    """dst[m] = src[m] for a mask m of dst's shape: NKX_COPY_IF reads and writes only where m holds (so index
    arrays may leave their tensor there, as the interpreter allows)."""
    d = tr.opd(dst, write=True, keep=m)
    if isinstance(src, Opd):
        s = src
    elif tuple(src.shape) == tuple(dst.shape):
        s = tr.opd(src, keep=m)
    else:
        s = tr.opd(src).reshape(d.shape)
    s = s if s.shape == d.shape else s.reshape(d.shape)
    same_kind = s.dt == d.dt or (s.name in _FLOAT_NAMES and d.name in _FLOAT_NAMES)
    if not same_kind or (s.region == d.region and s.region != 0 and _overlap(s, d, tr.regions) and not _same(s, d)):
        t = tr.temp(d.shape, d.name)  # converted (or staged) whole first: no index array may leave its tensor
        tr.copy(t, tr.opd(src).reshape(d.shape) if not isinstance(src, Opd) else s)
        s = t
    tr.emit(COPY_IF, [d, _pred(tr, m), s])


def rec_fill(tr, dst, value, mask=None):
    try:
        box = tr.mask_box(dst, mask)
    except Unsupported:
        box = False
    if box == ():
        tr.recorded = True
        return
    if box is not False:
        return tr.fill(dst, value, box)
    m = _mask_of(dst, mask)
    d = tr.opd(dst, write=True, keep=m)
    t = tr.temp(d.shape, d.name)
    tr.emit(FILL, [t], value=_fill_value_of(dst, value))
    tr.emit(COPY_IF, [d, _pred(tr, m), t])


def _fill_value_of(t, value):
    enc = t.dtype.encode(np.asarray(value))
    if t.dtype.kind == "f":
        return float(np.asarray(t.dtype.decode(enc)).reshape(-1)[0])
    return float(np.asarray(enc).reshape(-1)[0])


def rec_store(tr, dst, value, mask=None):
    if isinstance(value, _core.NkiTensor):
        rec_copy(tr, dst, value, mask)
    elif isinstance(value, (bool, int, float, np.integer, np.floating)) or (
            isinstance(value, np.ndarray) and value.ndim == 0):
        rec_fill(tr, dst, value, mask)
    else:
        raise Unsupported(f"a store of {type(value).__name__}")


def _float_srcs(srcs):
    for s in srcs:
        if s.name not in _FLOAT_NAMES + ("const",):
            raise Unsupported(f"compute on {s.name}")


def _int_tile(v):
    if isinstance(v, Opd):
        return v.name not in _FLOAT_NAMES + ("const",)
    return isinstance(v, _core.NkiTensor) and v.dtype.kind != "f"


def rec_chain(tr, dst, data, steps, mask=None, ints=None):
    """dst = step_n(...step_1(data)): each step (op, operand, reverse) with operand None, a scalar, an Opd or a
    (P, 1) tile broadcast along the free dims; intermediates stay fp32 as in the interpreter's numpy chain.
    ints ("tt", "ts", "stt": which nisa instruction) allows integer tiles, with the instruction's numpy rules."""
    x = data if isinstance(data, Opd) else tr.opd(data)
    if ints is not None and (_int_tile(x) or _int_tile(dst) or any(_int_tile(o) for _, o, _ in steps)):
        return _int_chain(tr, dst, x, steps, mask, ints)
    if ints is None and (_int_tile(x) or _int_tile(dst)):
        return _f32_chain(tr, dst, x, steps, mask)
    _float_srcs([x])
    shape = x.shape
    steps = [s for s in steps if s[0] is not None]
    d, fin = out_target(tr, dst, shape, mask)
    if d is None:
        tr.recorded = True
        return
    if fin is not None:
        rec_chain(tr, d, data, steps)
        return fin()
    if not steps:
        return tr.copy(d, x)
    for i, (op, operand, rev) in enumerate(steps):
        target = d if i == len(steps) - 1 else tr.temp(shape)
        if getattr(op, "arity", 2) == 1:
            tr.apply(op, target, [x])
        else:
            o = _tile_operand(tr, operand, shape)
            if o is None:
                o = tr.value_opd(operand, shape)
            _float_srcs([o])
            tr.apply(op, target, [o, x] if rev else [x, o])
        x = target


def _f32_chain(tr, dst, x, steps, mask):
    """activation / reciprocal of an integer tile or into one: the interpreter reads the data as fp32, runs the
    fp32 chain and encodes the result into dst (rounded and saturated into an integer), so the replay converts,
    runs the float chain into an fp32 temporary and copies it with that encoding."""
    d, fin = out_target(tr, dst, x.shape, mask)
    if d is None:
        tr.recorded = True
        return
    if x.name not in _FLOAT_NAMES:
        if x.name not in _INT_NAMES + ("bool_",):
            raise Unsupported(f"compute on {x.name}")
        t = tr.temp(x.shape)
        tr.copy(t, x)
        x = t
    target = d if d.name in _FLOAT_NAMES else tr.temp(x.shape)
    rec_chain(tr, target, x, steps)
    if target is not d:
        tr.copy(d, target)
    if fin is not None:
        fin()


def _tile_operand(tr, operand, shape):
    """A chain step's operand as an Opd over shape: an Opd as given, a tile as its per-partition column
    broadcast along the free dims; None for a scalar (each chain encodes scalars its own way)."""
    if isinstance(operand, Opd):
        return operand
    if isinstance(operand, _core.NkiTensor):
        o = tr.opd(operand)
        return o.reshape((o.shape[0],) + (1,) * (len(shape) - 1)).broadcast(shape)
    return None


def _int_chain(tr, dst, x, steps, mask, ints):
    """rec_chain with integer tiles: each step through Trace.int_op on the values the interpreter's numpy sees
    (intermediates in numpy's result dtype, scalars as nisa's _scalar_operand passes them)."""
    shape = x.shape
    d, fin = out_target(tr, dst, shape, mask)
    if d is None:
        tr.recorded = True
        return
    op0, operand0 = (steps[0][0], steps[0][1]) if steps else (None, None)
    if ints == "ts" and _int_tile(x) and op0 is not None and isinstance(operand0, float):
        t = tr.temp(shape)  # tensor_scalar reads an integer tile as fp32 for a Python float operand0
        tr.copy(t, x)
        x = t
    steps = [st for st in steps if st[0] is not None]
    if not steps:
        tr.copy(d, x)
    for i, (op, operand, rev) in enumerate(steps):
        if getattr(op, "arity", 2) == 1:
            srcs = [x]
        else:
            o = _tile_operand(tr, operand, shape)
            if o is None:
                o = np.float32(operand) if isinstance(operand, float) else operand
            srcs = [o, x] if rev else [x, o]
        x = tr.int_op(op, d if i == len(steps) - 1 else None, srcs)
    if fin is not None:
        fin()


def rec_activation_reduce(tr, res, data, steps, rop, rres, mask=None):
    """activation with reduce_cmd reset_reduce: res = f(...), rres = 0 (op) reduce(f(...) in fp32, free axes)."""
    if mask is not None:
        raise Unsupported("a masked activation reduce")
    x = tr.opd(data)
    shape = x.shape
    nd = len(shape)
    keep = (shape[0],) + (1,) * (nd - 1)
    name = reduce_name(rop)
    if name not in _REDUCE or name == "mean" or nd < 2:
        raise Unsupported(f"activation reduce with {rop!r}")
    if int(np.prod(rres.shape, dtype=np.int64)) != shape[0]:
        raise Unsupported("a reduce_res that is not one value per partition")
    full = tr.temp(shape)
    rec_chain(tr, full, data, steps)
    tr.copy(out_opd(tr, res, shape), full)
    red = tr.temp(keep)
    tr.emit(REDUCE, [red, full], op=_REDUCE[name], flags=sum(1 << a for a in range(1, nd)))
    from . import language as nl

    tr.apply(getattr(nl, {"add": "add", "sum": "add", "max": "maximum", "maximum": "maximum", "min": "minimum",
                          "minimum": "minimum"}[name]), tr.opd(rres, write=True).reshape(keep),
             [tr.const(0.0, keep), red])


def rec_const(tr, t):
    """t now holds values fixed at trace time (an iota): a copy from the constant pool."""
    d = tr.opd(t, write=True)
    tr.emit(COPY, [d, tr.const_tile(np.asarray(t.dtype.decode(t.raw()), dtype=np.float64).reshape(d.shape))])


def _select_operand(tr, v, shape, pred=False):
    if isinstance(v, _core.NkiTensor):
        o = tr.opd(v)
        o = o.reshape(shape) if int(np.prod(o.shape, dtype=np.int64)) == int(np.prod(shape, dtype=np.int64)) \
            else o.broadcast(shape)
        if not pred:
            _float_srcs([o])
        return o
    a = np.asarray(v)
    if pred:  # an index expression: its truth values, fixed at trace time
        return tr.const_tile(np.broadcast_to(a != 0, shape).astype(np.float64))
    if a.ndim == 0 and np.issubdtype(a.dtype, np.number):
        if float(np.float32(a)) != float(a) and not np.isnan(a):
            raise Unsupported("a select value fp32 does not hold exactly")
        return tr.const(float(a), shape)
    raise Unsupported(f"a select operand of type {type(v).__name__}")


def rec_select(tr, res, pred, on_true, on_false, mask=None):
    """res = where(pred != 0, on_true, on_false), each side rounded once to res's dtype: the false side copied,
    then the true side copied where pred holds (nki_exec.c: NKX_COPY_IF)."""
    if tr.mask_box(res, mask) is not None:
        raise Unsupported("a masked select")
    d = tr.opd(res, write=True)
    if d.name not in _FLOAT_NAMES or _int_tile(on_true) or _int_tile(on_false):
        return _select_int(tr, d, pred, on_true, on_false)
    shape = d.shape
    p = _select_operand(tr, pred, shape, pred=True)
    t = _select_operand(tr, on_true, shape)
    f = _select_operand(tr, on_false, shape)
    target = d
    if any(_overlap(d, o, tr.regions) and not (o.region == 0) for o in (p, t, f)) or \
            any(o.region == d.region and o.region != 0 for o in (p, t, f)):
        target = tr.temp(shape, d.name)  # the sources must be read before the destination is written
    tr.copy(target, f)
    tr.emit(COPY_IF, [target, p, t])
    if target is not d:
        tr.copy(d, target)


def _select_int(tr, d, pred, on_true, on_false):
    """rec_select with an integer side or destination: numpy's where computes in T = the sides' result dtype,
    then the store encodes into d's dtype. Each side becomes a tile of d's dtype (a tile cast through T with
    NKX_INT, a scalar a fill of its encoded value), then NKX_COPY_IF copies the true side where pred holds."""
    shape = d.shape

    def probe(v):
        if isinstance(v, _core.NkiTensor):
            return np.zeros(1, np.float32 if v.dtype.kind == "f" else v.dtype.storage)
        a = np.asarray(v)
        if a.ndim != 0 or a.dtype.kind not in "iubf":
            raise Unsupported(f"a select operand of type {type(v).__name__}")
        return v

    try:
        with np.errstate(all="ignore"):
            T = np.asarray(np.where(np.ones(1, bool), probe(on_true), probe(on_false))).dtype
    except (TypeError, ValueError, OverflowError) as e:
        raise Unsupported(f"a select of these operands: {e}")
    if T.name in _INT_NAMES or T.name == "bool":
        dom = _NK[T.name] if T.kind != "b" else _NK["uint8"]
    elif T.name == "float32":
        dom = _F32
    elif T.name == "float64":
        dom = 9
    else:
        raise Unsupported(f"a select computed in {T}")
    ddt = _core.to_dtype(d.name)

    def side(v, into):
        """Writes side v, converted as numpy's where then the store do, into the tile operand ``into``."""
        if isinstance(v, _core.NkiTensor):
            o = tr.opd(v)
            o = o.reshape(shape) if int(np.prod(o.shape, dtype=np.int64)) == int(np.prod(shape, dtype=np.int64)) \
                else o.broadcast(shape)
            if o.name in _FLOAT_NAMES and dom not in (_F32, 9):
                raise Unsupported("a float side in an integer select")
            return tr.emit(INT, [into, o], op=_IOP["copy"], flags=dom)
        try:
            with np.errstate(all="ignore"):
                vt = np.asarray(v).astype(T)  # numpy's where casts a Python int to T (wrapping)
                enc = ddt.encode(vt.reshape(1))
        except (TypeError, ValueError, OverflowError) as e:
            raise Unsupported(f"a select value: {e}")
        val = float(np.asarray(ddt.decode(enc)).reshape(-1)[0])
        if ddt.kind != "f" and abs(val) > 2 ** 53:
            raise Unsupported(f"a select value {v!r} past 2^53")
        tr.emit(FILL, [into], value=val)

    p = _select_operand(tr, pred, shape, pred=True)
    srcs = [p] + [tr.opd(v) for v in (on_true, on_false) if isinstance(v, _core.NkiTensor)]
    target = d
    if any(o.region == d.region and o.region != 0 for o in srcs):
        target = tr.temp(shape, d.name)  # the sources must be read before the destination is written
    side(on_false, target)
    t = tr.temp(shape, d.name)
    side(on_true, t)
    tr.emit(COPY_IF, [target, p, t])
    if target is not d:
        tr.copy(d, target)


def rec_copy_predicated(tr, dst, src, predicate, reverse):
    """dst = pred ? src : dst in place (nisa.tensor_copy_predicated): NKX_COPY_IF, the predicate negated by an
    == 0 step for reverse_pred."""
    d = tr.opd(dst, write=True)
    if d.name not in _FLOAT_NAMES:
        raise Unsupported(f"a predicated copy into {d.name}")
    shape = d.shape
    if isinstance(predicate, _core.NkiTensor):
        p = _select_operand(tr, predicate, shape, pred=True)
        if reverse:
            q = tr.temp(shape)
            tr.emit(BINARY, [q, p, tr.const(0.0, shape)], op=_BINARY["equal"][0])
            p = q
    else:
        a = np.asarray(predicate).reshape(shape) != 0
        p = tr.const_tile((~a if reverse else a).astype(np.float64))
    t = _select_operand(tr, src, shape)
    for o in (p, t):  # read and written element by element: only the very same view may overlap dst
        if _overlap(o, d, tr.regions) and not _same(o, d):
            raise Unsupported("a predicated copy whose operands overlap its destination")
    tr.emit(COPY_IF, [d, p, t])


def _row_axes(x, axis):
    """The reduced axes of nl.softmax / nl.rms_norm over tile x: free axes only (a reduce over the partitions is
    not lowered)."""
    if not isinstance(x, _core.NkiTensor):
        raise Unsupported("a softmax or rms_norm of a non-tile")
    nd = len(x.shape)
    axes = sorted({int(a) % nd for a in (axis if isinstance(axis, (list, tuple)) else (axis,))})
    if 0 in axes:
        raise Unsupported("a softmax or rms_norm over the partition axis")
    return axes, tuple(1 if i in axes else n for i, n in enumerate(x.shape))


def _f32_operand(tr, x):
    """x as a float operand in fp32: the interpreter computes softmax and rms_norm in fp32."""
    v = tr.opd(x)
    _float_srcs([v])
    if v.dt != _F32:
        t = tr.temp(v.shape)
        tr.copy(t, v)
        v = t
    return v


def rec_softmax(tr, out, x, axis):
    """nl.softmax as the interpreter computes it, in fp32: e = exp(x - max), out = e / sum(e)."""
    axes, keep = _row_axes(x, axis)
    v = _f32_operand(tr, x)
    flags = sum(1 << a for a in axes)
    mx = tr.temp(keep)
    tr.emit(REDUCE, [mx, v], op=_REDUCE["max"], flags=flags)
    e = tr.temp(v.shape)
    tr.emit(BINARY, [e, v, mx.broadcast(v.shape)], op=0, value=-1.0)
    tr.emit(UNARY, [e, e], op=_UNARY["exp"])
    s = tr.temp(keep)
    tr.emit(REDUCE, [s, e], op=_REDUCE["sum"], flags=flags)
    tr.emit(BINARY, [out_opd(tr, out, v.shape), e, s.broadcast(v.shape)], op=_BINARY["divide"][0])


def rec_rms_norm(tr, out, x, w, axis, n, eps):
    """nl.rms_norm as the interpreter computes it, in fp32 (n and eps rounded to fp32 as it does):
    x / sqrt(sum(x * x) / n + eps) * w."""
    axes, keep = _row_axes(x, axis)
    v = _f32_operand(tr, x)
    sq = tr.temp(v.shape)
    tr.emit(BINARY, [sq, v, v], op=_BINARY["multiply"][0])
    ms = tr.temp(keep)
    tr.emit(REDUCE, [ms, sq], op=_REDUCE["sum"], flags=sum(1 << a for a in axes))
    tr.emit(BINARY, [ms, ms, tr.const(float(n), keep)], op=_BINARY["divide"][0])
    tr.emit(BINARY, [ms, ms, tr.const(float(eps), keep)], op=0, value=1.0)
    tr.emit(UNARY, [ms, ms], op=_UNARY["sqrt"])
    y = tr.temp(v.shape)
    tr.emit(BINARY, [y, v, ms.broadcast(v.shape)], op=_BINARY["divide"][0])
    wo = _select_operand(tr, w, v.shape)
    tr.emit(BINARY, [out_opd(tr, out, v.shape), y, wo], op=_BINARY["multiply"][0])


def rec_load(tr, t, src, mask=None):
    """nl.load: a copy into the new tile (of the box a mask keeps; the rest keeps the allocation's fill)."""
    rec_copy(tr, t, src, mask)


def rec_nl_reduce(tr, out, x, name, axis, mask=None):
    """nl.sum/max/min/mean: the interpreter reduces every element and writes the whole result tile, with or
    without a mask (nki/language.py's _reduce does not apply it), so the mask is not lowered either."""
    if not isinstance(x, _core.NkiTensor):
        raise Unsupported("a reduction of a non-tile")
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    tr.reduce(out, tr.opd(x), name, axes, npfn=getattr(np, name, None))


def rec_binary_tiles(tr, out, x, y, op, mask=None):
    """The tile API's out = op(x, y) (or op(x)): partition-first alignment, then numpy broadcasting."""
    d, fin = out_target(tr, out, None, mask)
    if d is None:
        tr.recorded = True
        return
    shape = out.shape
    ops = []
    tiles = [v for v in (x, y) if isinstance(v, _core.NkiTensor)]
    ints = _int_tile(out) or any(_int_tile(v) for v in tiles)
    for v in ((x,) if y is None else (x, y)):
        if isinstance(v, _core.NkiTensor):
            o = tr.opd(v) if ints else tr.value_opd(v, shape)
            other = next((t for t in tiles if t is not v), None)
            if other is not None and len(v.shape) < len(other.shape) and v.shape and v.shape[0] == other.shape[0]:
                o = o.reshape(tuple(o.shape) + (1,) * (len(other.shape) - len(v.shape)))
            ops.append(o.broadcast(shape))
        else:
            ops.append(v if ints else tr.value_opd(v, shape))
    if ints:
        tr.int_op(op, d, ops)
    else:
        tr.apply(op, d, ops)
    if fin is not None:
        fin()


def rec_matmul(tr, dst, st, mv, accumulate, shape_m_n=None):
    k = st.shape[0]
    m = int(np.prod(st.shape[1:], dtype=np.int64)) if len(st.shape) > 1 else 1
    n = int(np.prod(mv.shape[1:], dtype=np.int64)) if len(mv.shape) > 1 else 1
    a = tr.opd(st).reshape((k, m)).transpose2d()
    b = tr.opd(mv).reshape((k, n))
    tr.gemm(tr.opd(dst, write=True).reshape((m, n)), a, b, accumulate)


def rec_nl_matmul(tr, out, x, y, transpose_x):
    if len(x.shape) != 2 or len(y.shape) != 2:
        raise Unsupported("nl.matmul of tiles that are not 2D")
    a = tr.opd(x)
    a = a.transpose2d() if transpose_x else a
    tr.gemm(tr.opd(out, write=True), a, tr.opd(y), False)


def reduce_name(op):
    from . import language as nl

    if isinstance(op, nl._Op):
        return op.name
    for name in ("sum", "max", "min", "mean"):
        if op is getattr(nl, name) or op is getattr(np, name):
            return name
    raise Unsupported(f"reduction {op!r}")


def rec_reduce(tr, dst, data, op, axis, negate=False, mask=None):
    from . import isa

    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    tr.reduce(dst, tr.opd(data), reduce_name(op), axes, negate, mask, npfn=isa._reducer(op))


def rec_transpose(tr, dst, src):
    s = tr.opd(src)
    p = s.shape[0]
    f = int(np.prod(s.shape[1:], dtype=np.int64)) if len(s.shape) > 1 else 1
    s = s.reshape((p, f)).transpose2d()
    tr.copy(out_opd(tr, dst, (f, p)), s)


def rec_accumulate(tr, dst, res, open_all, open_none):
    d = tr.opd(dst, write=True)
    r = tr.opd(res).reshape(d.shape)
    if open_all:
        tr.emit(BINARY, [d, d, r], op=0, value=1.0)
    elif open_none:
        tr.copy(d, r)
    else:
        raise Unsupported("a PSUM accumulation group open on part of the tile")


def _install_tensor_hooks():
    """Lowerings of the NkiTensor operators (``t += x``, ``psum += matmul``, ``t[k] = v``)."""
    T = _core.NkiTensor
    inplace, accumulate, setitem = T._inplace, T._accumulate, T.__setitem__

    @instr
    def _inplace(self, o, name):
        from . import language as nl

        res = inplace(self, o, name)

        def rec(tr):
            if _int_tile(self) or _int_tile(o):
                src = tr.opd(o).broadcast(self.shape) if isinstance(o, _core.NkiTensor) else o
                return tr.int_op(getattr(nl, name), tr.opd(self, write=True), [tr.opd(self), src])
            tr.apply(getattr(nl, name), tr.opd(self, write=True),
                     [tr.opd(self), tr.value_opd(o, self.shape).broadcast(self.shape)])

        record(rec)
        return res

    @instr
    def _accumulate(self, o):
        acc = self.storage.acc
        open_ = acc[self.offsets] if self.offsets is not None else self.acc_view()
        flags = (bool(np.all(open_)), not bool(np.any(open_))) if _core.TRACE is not None else None
        res = accumulate(self, o)
        record(rec_accumulate, self, o, *flags) if flags else None
        return res

    @instr
    def __setitem__(self, key, value):
        setitem(self, key, value)
        dst = self[key]
        if dst._same_view(value):
            if _core.TRACE is not None:
                _core.TRACE.recorded = True
            return
        record(rec_store, dst, value)

    T._inplace, T._accumulate, T.__setitem__ = _inplace, _accumulate, __setitem__


_install_tensor_hooks()
