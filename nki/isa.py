"""``nki.isa`` (``nisa``): the NeuronCore instructions, with the semantics and limits of their docstrings in
aws-neuron-sdk ``nki/api/nki/isa``. Every instruction accepts the current form (``dst=`` first, returns
nothing useful) and the older form (no ``dst``, returns a new tile)."""

from __future__ import annotations

from enum import Enum

import numpy as np

from . import _compile, _core
from . import language as nl
from ._core import NkiError, NkiTensor, error, limit_error, psum, sbuf, to_dtype

NkiValidationError = NkiError


class engine(Enum):
    unknown = 0
    tensor = 1
    vector = 2
    scalar = 3
    gpsimd = 4
    sync = 5
    activation = 3
    pool = 4


class reduce_cmd(Enum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(Enum):
    unknown = 0
    none = 1
    swdge = 2
    hwdge = 3


class oob_mode(Enum):
    error = 0
    skip = 1


class matmul_perf_mode(Enum):
    none = 0
    double_row = 1
    double_row_gen3 = 1


class nc_version(Enum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


_VERSIONS = {"trn1": nc_version.gen2, "inf2": nc_version.gen2, "gen2": nc_version.gen2,
             "trn2": nc_version.gen3, "gen3": nc_version.gen3, "trn3": nc_version.gen4, "gen4": nc_version.gen4}


def get_nc_version():
    inst = _core.current()
    return _VERSIONS[inst.launch.target if inst else _core.resolve_target()]


def get_nc_sub_version():
    return 0


# ----------------------------------------------------------------------------------------------- helpers
def _bind(args, kw, new_names, old_names, is_new):
    names = new_names if is_new else old_names
    if len(args) > len(names):
        raise TypeError(f"too many positional arguments: {len(args)}")
    b = dict(zip(names, args))
    for k, v in kw.items():
        if k in b:
            raise TypeError(f"argument {k!r} given twice")
        b[k] = v
    return b


def _is_tensor(x):
    return isinstance(x, NkiTensor)


def _onchip(t, what, instr, allowed=("sbuf", "psum")):
    if not isinstance(t, NkiTensor):
        raise error(f"nisa.{instr}: {what} must be a tile, got {type(t).__name__}")
    if t.buffer.name not in allowed:
        raise error(f"nisa.{instr}: {what} must be in {' or '.join(a.upper() for a in allowed)}, "
                    f"got {t.buffer.name.upper()}")
    if t.shape and t.shape[0] > _core.PMAX:
        raise limit_error(f"nisa.{instr} {what} partition dimension (nl.tile_size.pmax)", t.shape[0], _core.PMAX)
    return t


def _2d(v, p):
    v = np.asarray(v)
    return v.reshape(p, -1) if v.ndim != 2 else v


def _fn(op):
    if isinstance(op, nl._Op):
        return op.fn
    if op is None:
        return None
    if callable(op):
        return op
    raise error(f"unsupported operator {op!r}")


def _scalar_operand(x, p, nd):
    """A tensor_scalar/activation operand: a constant or a (P, 1) vector broadcast along the free dims."""
    if isinstance(x, NkiTensor):
        v = nl._values(x)
        if v.shape[0] != p or int(np.prod(v.shape[1:], dtype=np.int64)) != 1:
            raise error(f"a vector operand must have shape ({p}, 1), got {x.shape}")
        return v.reshape((p,) + (1,) * (nd - 1))
    return np.float32(x) if isinstance(x, float) else x


def _out(dst, vals, dtype, instr, buffer=sbuf, mask=None):
    """Write ``vals`` to ``dst`` (rounded to its dtype) or, in the older form, to a new tile."""
    vals = np.asarray(vals)
    if dst is None:
        return nl._new_tile(vals, dtype, buffer, mask=mask)
    if not isinstance(dst, NkiTensor):
        raise error(f"nisa.{instr}: dst must be a tile, got {type(dst).__name__}")
    if vals.shape != dst.shape:
        if dst.shape and vals.shape and vals.shape[0] != dst.shape[0]:
            raise error(f"nisa.{instr}: dst has {dst.shape[0]} partitions, the result has {vals.shape[0]} "
                        f"(dst shape {dst.shape}, result shape {vals.shape})")
        if vals.size != dst.size:
            raise error(f"nisa.{instr}: dst shape {dst.shape} does not hold the result shape {vals.shape}")
        vals = vals.reshape(dst.shape)
    dst.write(vals, mask=mask)
    return dst


def _op_or_none(op):
    """An operator as the lowering sees it: nl ops as themselves, None, anything else not lowerable."""
    return op if op is None or isinstance(op, nl._Op) else _NOT_LOWERED


_NOT_LOWERED = nl._Op("not_lowered", None, 2)


# ----------------------------------------------------------------------------------------------- data movement
@_compile.instr
def dma_copy(*args, **kw):
    b = _bind(args, kw, ("dst", "src"), ("dst", "src"), True)
    dst, src, mask = b["dst"], b["src"], b.get("mask")
    if not _is_tensor(dst) or not _is_tensor(src):
        raise error("nisa.dma_copy: dst and src must be tensors")
    if dst.size != src.size:
        raise error(f"nisa.dma_copy: src has {src.size} elements {src.shape}, dst has {dst.size} {dst.shape}")
    vals = src.read()
    if dst.shape != src.shape:
        vals = np.asarray(vals).reshape(dst.shape)
    dst.write(vals, mask=mask)
    _compile.record(lambda tr: tr.copy(tr.opd(dst, write=True), tr.opd(src).reshape(dst.shape)) if mask is None
                    else _compile.rec_copy(tr, dst, tr.opd(src).reshape(dst.shape), mask))
    return dst


@_compile.instr
def dma_transpose(*args, **kw):
    b = _bind(args, kw, ("dst", "src", "axes"), ("src", "axes"), len(args) >= 2 and _is_tensor(args[1]) or "dst" in kw)
    src = b["src"]
    v = np.asarray(src.read())
    axes = b.get("axes")
    v = np.transpose(v, axes) if axes is not None else v.reshape(v.shape[0], -1).T
    res = _out(b.get("dst"), v, b.get("dtype") or src.dtype, "dma_transpose")
    if axes is not None:
        _compile.record(lambda tr: tr.copy(_compile.out_opd(tr, res, v.shape), _compile.Opd(
            *(lambda o: (o.region, o.dt, [o.shape[a] for a in axes], [o.strides[a] for a in axes], o.off,
                         o.name))(tr.opd(src)))))
    else:
        _compile.record(_compile.rec_transpose, res, src)
    return res


@_compile.instr
def tensor_copy(*args, **kw):
    b = _bind(args, kw, ("dst", "src", "engine"), ("src", "mask", "dtype", "engine"),
              (len(args) >= 2 and _is_tensor(args[1])) or "dst" in kw)
    src = _onchip(b["src"], "src", "tensor_copy")
    res = _out(b.get("dst"), src.read(), b.get("dtype") or src.dtype, "tensor_copy", mask=b.get("mask"))
    _compile.record(_compile.rec_chain, res, src, [], b.get("mask"), "tt")
    return res


@_compile.instr
def memset(*args, **kw):
    is_new = (args and _is_tensor(args[0])) or "dst" in kw
    b = _bind(args, kw, ("dst", "value", "engine"), ("shape", "value", "dtype", "mask", "engine"), is_new)
    if is_new:
        dst = _onchip(b["dst"], "dst", "memset")
        dst.write(np.asarray(b["value"]), mask=b.get("mask"))
        _compile.record(_compile.rec_fill, dst, b["value"], b.get("mask"))
        return dst
    res = nl._new_tile(np.full(tuple(b["shape"]), b["value"], dtype=np.float32), b["dtype"])
    _compile.record(_compile.rec_fill, res, np.float32(b["value"]))
    return res


# ----------------------------------------------------------------------------------------------- Tensor Engine
def _check_matmul(st_shape, mv_shape):
    k = st_shape[0]
    m = int(np.prod(st_shape[1:], dtype=np.int64)) if len(st_shape) > 1 else 1
    k2 = mv_shape[0]
    n = int(np.prod(mv_shape[1:], dtype=np.int64)) if len(mv_shape) > 1 else 1
    if k > 128:
        raise limit_error("nc_matmul contraction dimension (partition dim of stationary/moving)", k, 128)
    if k2 > 128:
        raise limit_error("nc_matmul contraction dimension (partition dim of stationary/moving)", k2, 128)
    if k != k2:
        raise error(f"nc_matmul: contraction dimensions differ: stationary {st_shape}, moving {mv_shape}")
    if m > 128:
        raise limit_error("nc_matmul stationary free dimension (gemm_stationary_fmax)", m, 128)
    if n > 512:
        raise limit_error("nc_matmul moving free dimension (gemm_moving_fmax)", n, 512)
    return k, m, n


@_compile.instr
def nc_matmul(*args, **kw):
    is_new = (len(args) >= 3 and _is_tensor(args[2])) or "dst" in kw
    b = _bind(args, kw, ("dst", "stationary", "moving", "is_stationary_onezero", "is_moving_onezero",
                         "is_transpose", "accumulate", "tile_position", "tile_size", "perf_mode"),
              ("stationary", "moving", "is_stationary_onezero", "is_moving_onezero", "is_transpose",
               "tile_position", "tile_size", "mask", "perf_mode"), is_new)
    st = _onchip(b["stationary"], "stationary", "nc_matmul", ("sbuf",))
    mv = _onchip(b["moving"], "moving", "nc_matmul", ("sbuf",))
    k, m, n = _check_matmul(st.shape, mv.shape)
    if (st.dtype.name in ("float32", "tfloat32")) != (mv.dtype.name in ("float32", "tfloat32")):
        raise error(f"nc_matmul: if one input is float32/tfloat32 both must be (stationary {st.dtype}, "
                    f"moving {mv.dtype})")
    sv = np.asarray(st.read(), np.float32).reshape(k, m)
    mvv = np.asarray(mv.read(), np.float32).reshape(k, n)
    res = sv.T @ mvv  # fp32 accumulation, as the Tensor Engine
    dst = b.get("dst")
    if dst is None:
        t = nl._new_tile(res, st.dtype if b.get("is_transpose") else _core.float32, psum)
        t._matmul_result = True
        _compile.record(_compile.rec_matmul, t, st, mv, False)
        return t
    _onchip(dst, "dst", "nc_matmul", ("psum",))
    ok = ("float32",) if get_nc_version() != nc_version.gen4 else ("float32", "bfloat16")
    if dst.dtype.name not in ok and not b.get("is_transpose"):
        raise error(f"nc_matmul: dst must be {' or '.join(ok)} in PSUM, got {dst.dtype}")
    if dst.shape[0] != m or dst.size != m * n:
        raise error(f"nc_matmul: dst shape {dst.shape} does not match the result [{m}, {n}]")
    res = res.reshape(dst.shape)
    acc = b.get("accumulate")
    st_acc = dst.storage.acc
    if dst.offsets is not None:
        open_ = st_acc[dst.offsets]
    else:
        open_ = dst.acc_view()
    old = dst.dtype.decode(dst.raw())  # reading for accumulation does not close the group
    # Which elements accumulate depends only on the instruction sequence: the trace resolves it here.
    open_all, open_none = (bool(np.all(open_)), not bool(np.any(open_))) if _core.TRACE is not None else (0, 0)
    if acc is None:
        new = np.where(open_, old + res, res)
    elif acc:
        new = old + res
    else:
        new = res
    dst.write(new)
    if dst.offsets is not None:
        st_acc[dst.offsets] = True
    else:
        dst.acc_view()[...] = True
    if acc is None and not (open_all or open_none):
        _compile.record(lambda tr: (_ for _ in ()).throw(_compile.Unsupported("a partly open PSUM group")))
    else:
        _compile.record(_compile.rec_matmul, dst, st, mv, bool(acc) if acc is not None else open_all)
    return dst


@_compile.instr
def nc_transpose(*args, **kw):
    is_new = (len(args) >= 2 and _is_tensor(args[1])) or "dst" in kw
    b = _bind(args, kw, ("dst", "data", "engine"), ("data", "mask", "dtype", "engine"), is_new)
    data = _onchip(b["data"], "data", "nc_transpose")
    p = data.shape[0]
    f = int(np.prod(data.shape[1:], dtype=np.int64)) if data.ndim > 1 else 1
    eng = b.get("engine", engine.unknown)
    lim = 32 if eng == engine.vector else 128
    name = "Vector Engine" if lim == 32 else "Tensor Engine"
    if p > lim:
        raise limit_error(f"nc_transpose partition dimension ({name})", p, lim)
    if f > lim:
        raise limit_error(f"nc_transpose free dimension ({name})", f, lim)
    v = np.asarray(data.read()).reshape(p, f).T
    dst = b.get("dst")
    if dst is not None and eng != engine.vector:
        _onchip(dst, "dst", "nc_transpose", ("psum",) if data.buffer is sbuf else ("sbuf", "psum"))
    res = _out(dst, v, b.get("dtype") or data.dtype, "nc_transpose", buffer=psum)
    _compile.record(_compile.rec_transpose, res, data)
    return res


# ----------------------------------------------------------------------------------------------- Vector/Scalar
@_compile.instr
def tensor_tensor(*args, **kw):
    is_new = (len(args) >= 3 and _is_tensor(args[2])) or "dst" in kw
    b = _bind(args, kw, ("dst", "data1", "data2", "op", "engine"), ("data1", "data2", "op", "dtype", "mask",
                                                                    "engine"), is_new)
    d1 = _onchip(b["data1"], "data1", "tensor_tensor")
    d2 = _onchip(b["data2"], "data2", "tensor_tensor")
    if d1.buffer is psum and d2.buffer is psum:
        raise error("nisa.tensor_tensor: data1 and data2 cannot both be in PSUM")
    p = d1.shape[0]
    if d2.shape[0] != p or d2.size != d1.size:
        raise error(f"nisa.tensor_tensor: data1 {d1.shape} and data2 {d2.shape} must have the same partition "
                    "size and elements per partition")
    a, c = d1.read(), np.asarray(d2.read()).reshape(d1.shape)
    res = _fn(b["op"])(a, c)
    out = _out(b.get("dst"), res, b.get("dtype") or _core.promote(d1.dtype, d2.dtype), "tensor_tensor",
               mask=b.get("mask"))
    _compile.record(lambda tr: _compile.rec_chain(tr, out, d1, [(_op_or_none(b["op"]), tr.opd(d2).reshape(d1.shape),
                                                                 False)], b.get("mask"), "tt"))
    return out


def _apply(op, x, operand, reverse):
    f = _fn(op)
    if f is None:
        return x
    if isinstance(op, nl._Op) and op.arity == 1:
        return f(x)
    return f(operand, x) if reverse else f(x, operand)


@_compile.instr
def tensor_scalar(*args, **kw):
    is_new = (len(args) >= 2 and _is_tensor(args[1])) or "dst" in kw
    b = _bind(args, kw, ("dst", "data", "op0", "operand0", "reverse0", "op1", "operand1", "reverse1", "engine"),
              ("data", "op0", "operand0", "reverse0", "op1", "operand1", "reverse1", "dtype", "mask", "engine"),
              is_new)
    data = _onchip(b["data"], "data", "tensor_scalar")
    p, nd = data.shape[0], data.ndim
    x = data.read()
    if x.dtype.kind in "iub" and _fn(b["op0"]) is not None and not isinstance(b.get("operand0"), NkiTensor) \
            and isinstance(b.get("operand0"), float):
        x = x.astype(np.float32)
    x = _apply(b["op0"], x, _scalar_operand(b.get("operand0"), p, nd), b.get("reverse0", False))
    if b.get("op1") is not None:
        x = _apply(b["op1"], x, _scalar_operand(b.get("operand1"), p, nd), b.get("reverse1", False))
    out = _out(b.get("dst"), x, b.get("dtype") or data.dtype, "tensor_scalar", mask=b.get("mask"))
    _compile.record(_compile.rec_chain, out, data,
                    [(_op_or_none(b["op0"]), b.get("operand0"), b.get("reverse0", False)),
                     (_op_or_none(b.get("op1")), b.get("operand1"), b.get("reverse1", False))], b.get("mask"), "ts")
    return out


@_compile.instr
def scalar_tensor_tensor(*args, **kw):
    is_new = (len(args) >= 2 and _is_tensor(args[1])) or "dst" in kw
    b = _bind(args, kw, ("dst", "data", "op0", "operand0", "op1", "operand1", "reverse0", "reverse1"),
              ("data", "op0", "operand0", "op1", "operand1", "reverse0", "reverse1", "dtype", "mask"), is_new)
    data = _onchip(b["data"], "data", "scalar_tensor_tensor")
    p, nd = data.shape[0], data.ndim
    x = _apply(b["op0"], data.read(), _scalar_operand(b["operand0"], p, nd), b.get("reverse0", False))
    o1 = np.asarray(_onchip(b["operand1"], "operand1", "scalar_tensor_tensor").read()).reshape(data.shape)
    x = _apply(b["op1"], x, o1, b.get("reverse1", False))
    out = _out(b.get("dst"), x, b.get("dtype") or data.dtype, "scalar_tensor_tensor", mask=b.get("mask"))
    _compile.record(lambda tr: _compile.rec_chain(
        tr, out, data, [(_op_or_none(b["op0"]), b["operand0"], b.get("reverse0", False)),
                        (_op_or_none(b["op1"]), tr.opd(b["operand1"]).reshape(data.shape), b.get("reverse1", False))],
        b.get("mask"), "stt"))
    return out


_REDUCERS = {}


def _reducer(op):
    if op in _REDUCERS:
        return _REDUCERS[op]
    if isinstance(op, nl._Op) and op.reduce is not None:
        return lambda a, axis, keepdims=False: op.reduce(a, axis=axis, keepdims=keepdims)
    if isinstance(op, np.ufunc):
        return lambda a, axis, keepdims=False: op.reduce(a, axis=axis, keepdims=keepdims)
    raise error(f"unsupported reduction operator {op!r}")


def _init_reducers():
    for f, r in ((nl.sum, np.sum), (nl.max, np.max), (nl.min, np.min), (nl.mean, np.mean), (nl.prod, np.prod)):
        _REDUCERS[f] = r


_init_reducers()


def _red_axes(axis, nd, instr):
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    axes = tuple(int(a) % nd for a in axes)
    if 0 in axes:
        raise error(f"nisa.{instr}: the partition axis (0) cannot be reduced; transpose first or use nc_matmul "
                    "with a ones vector")
    return axes


@_compile.instr
def tensor_reduce(*args, **kw):
    is_new = (args and _is_tensor(args[0])) or "dst" in kw
    b = _bind(args, kw, ("dst", "op", "data", "axis", "negate", "keepdims"),
              ("op", "data", "axis", "mask", "dtype", "negate", "keepdims"), is_new)
    data = _onchip(b["data"], "data", "tensor_reduce")
    axes = _red_axes(b["axis"], data.ndim, "tensor_reduce")
    x = data.read()
    if x.dtype.kind not in "iub":
        x = x.astype(np.float32)
    r = _reducer(b["op"])(x, axis=axes, keepdims=b.get("keepdims", False))
    if b.get("negate"):
        r = -r
    out = _out(b.get("dst"), r, b.get("dtype") or data.dtype, "tensor_reduce", mask=b.get("mask"))
    _compile.record(_compile.rec_reduce, out, data, b["op"], axes, bool(b.get("negate")), b.get("mask"))
    return out


def _regs():
    inst = _core.current()
    if inst is None:
        raise error("reduce registers are only available inside a running kernel")
    if not hasattr(inst, "reduce_regs"):
        inst.reduce_regs = np.zeros(_core.PMAX, np.float32)
    return inst


@_compile.instr
def activation(*args, **kw):
    is_new = (args and _is_tensor(args[0])) or "dst" in kw
    b = _bind(args, kw, ("dst", "op", "data", "bias", "scale", "reduce_op", "reduce_res", "reduce_cmd"),
              ("op", "data", "bias", "scale", "reduce_op", "reduce_res", "reduce_cmd", "mask", "dtype"), is_new)
    data = _onchip(b["data"], "data", "activation")
    p, nd = data.shape[0], data.ndim
    x = np.asarray(data.read(), np.float32)
    scale = _scalar_operand(b.get("scale", 1.0) if b.get("scale") is not None else 1.0, p, nd)
    x = x * np.float32(scale) if np.isscalar(scale) else x * scale
    if b.get("bias") is not None:
        x = x + _scalar_operand(b["bias"], p, nd)
    f = _fn(b["op"])
    with np.errstate(all="ignore"):
        out = f(x)
    res = _out(b.get("dst"), out, b.get("dtype") or data.dtype, "activation", mask=b.get("mask"))
    _activation_reduce(out, p, b.get("reduce_op"), b.get("reduce_res"), b.get("reduce_cmd", reduce_cmd.idle))
    sc = b.get("scale")
    one = sc is None or (not isinstance(sc, NkiTensor) and float(sc) == 1.0)  # x * 1.0 is x
    steps = [(None if one else nl.multiply, sc, False),
             (nl.add if b.get("bias") is not None else None, b.get("bias"), False),
             (b["op"] if isinstance(b["op"], nl._Op) else _NOT_LOWERED, None, False)]
    rop, rres, cmd = b.get("reduce_op"), b.get("reduce_res"), b.get("reduce_cmd", reduce_cmd.idle)
    if rop is None and rres is None and cmd in (None, reduce_cmd.idle):
        _compile.record(_compile.rec_chain, res, data, steps, b.get("mask"))
    elif rop is not None and rres is not None and cmd in (None, reduce_cmd.idle, reduce_cmd.reset_reduce):
        _compile.record(_compile.rec_activation_reduce, res, data, steps, rop, rres, b.get("mask"))
    return res


def _activation_reduce(out, p, rop, rres, cmd):
    if rop is None and rres is None and cmd in (None, reduce_cmd.idle):
        return
    inst = _regs()
    if rres is not None and rop is not None and cmd in (None, reduce_cmd.idle):
        cmd = reduce_cmd.reset_reduce  # a reduce_res with a reduce_op and no command: reduce this output
    if cmd in (reduce_cmd.reset, reduce_cmd.reset_reduce):
        inst.reduce_regs[:] = 0
    if rop is not None and cmd in (reduce_cmd.reduce, reduce_cmd.reset_reduce):
        red = _reducer(rop)(np.asarray(out, np.float32).reshape(p, -1), axis=1)
        inst.reduce_regs[:p] = _fn(rop)(inst.reduce_regs[:p], red)
    if rres is not None:
        rres.write(inst.reduce_regs[:p].reshape(p, 1).reshape(rres.shape) if rres.size == p
                   else inst.reduce_regs[:p].reshape(p, 1))


def activation_reduce(*args, **kw):
    is_new = (args and _is_tensor(args[0])) or "dst" in kw
    b = _bind(args, kw, ("dst", "op", "data", "reduce_op", "reduce_res", "bias", "scale"),
              ("op", "data", "reduce_op", "reduce_res", "bias", "scale", "mask", "dtype"), is_new)
    b["reduce_cmd"] = reduce_cmd.reset_reduce
    return activation(**b)


@_compile.instr
def reciprocal(*args, **kw):
    is_new = (len(args) >= 2 and _is_tensor(args[1])) or "dst" in kw
    b = _bind(args, kw, ("dst", "data"), ("data", "dtype", "mask"), is_new)
    data = _onchip(b["data"], "data", "reciprocal")
    with np.errstate(all="ignore"):
        r = np.float32(1.0) / np.asarray(data.read(), np.float32)
    out = _out(b.get("dst"), r, b.get("dtype") or data.dtype, "reciprocal", mask=b.get("mask"))
    _compile.record(_compile.rec_chain, out, data, [(nl.reciprocal, None, False)], b.get("mask"))
    return out


def _pattern_values(pattern, offset, channel_multiplier, p):
    pat = [list(x) for x in pattern]
    vals = np.zeros([1] * len(pat), dtype=np.int64) if pat else np.zeros((), np.int64)
    for i, (step, num) in enumerate(pat):
        shape = [1] * len(pat)
        shape[i] = int(num)
        vals = vals + np.arange(int(num), dtype=np.int64).reshape(shape) * int(step)
    vals = vals.reshape(1, -1) + int(offset) + np.arange(p, dtype=np.int64).reshape(p, 1) * int(channel_multiplier)
    return vals  # (p, prod(nums))


@_compile.instr
def iota(*args, **kw):
    is_new = (args and _is_tensor(args[0])) or "dst" in kw
    b = _bind(args, kw, ("dst", "pattern", "offset", "channel_multiplier"), ("expr", "dtype", "mask"), is_new)
    if not is_new:  # older form: an index expression (numpy array) to materialise
        v = np.asarray(b["expr"])
        if v.ndim < 2:
            v = v.reshape(1, -1) if v.ndim == 1 else v.reshape(1, 1)
        t = nl._new_tile(v, b.get("dtype") or _core.int32)
        _compile.record(_compile.rec_const, t)
        return t
    dst = _onchip(b["dst"], "dst", "iota", ("sbuf",))
    vals = _pattern_values(b["pattern"], b.get("offset", 0), b.get("channel_multiplier", 0), dst.shape[0])
    if vals.size != dst.size:
        raise error(f"nisa.iota: the pattern has {vals.shape[1]} elements per partition, dst has "
                    f"{dst.size // max(dst.shape[0], 1)}")
    dst.write(vals.reshape(dst.shape).astype(np.float64) if dst.dtype.is_float else vals.reshape(dst.shape))
    _compile.record(_compile.rec_const, dst)  # the values depend on the arguments only through their shapes
    return dst


@_compile.instr
def affine_select(*args, **kw):
    is_new = (args and _is_tensor(args[0])) or "dst" in kw
    b = _bind(args, kw, ("dst", "pattern", "channel_multiplier", "on_true_tile", "on_false_value", "cmp_op",
                         "offset"), ("pred", "on_true_tile", "on_false_value", "dtype", "mask"), is_new)
    on_true = _onchip(b["on_true_tile"], "on_true_tile", "affine_select")
    p = on_true.shape[0]
    t = np.asarray(on_true.read())
    if is_new:
        dst = _onchip(b["dst"], "dst", "affine_select", ("sbuf",))
        vals = _pattern_values(b["pattern"], b.get("offset", 0), b["channel_multiplier"], p)
        cmp = _fn(b.get("cmp_op") or nl.equal)
        pred = np.asarray(cmp(vals, 0)) != 0
        if pred.size != on_true.size:
            raise error("nisa.affine_select: the pattern does not cover on_true_tile")
        res = np.where(pred.reshape(on_true.shape), t, np.float32(b["on_false_value"]))
        out = _out(dst, res, dst.dtype, "affine_select")
        _compile.record(_compile.rec_select, out, pred.reshape(on_true.shape), on_true,
                        np.float32(b["on_false_value"]))
        return out
    pred = np.broadcast_to(np.asarray(b["pred"]) != 0, on_true.shape)
    res = np.where(pred, t, np.float32(b["on_false_value"]))
    out = nl._new_tile(res, b.get("dtype") or on_true.dtype, mask=b.get("mask"))
    _compile.record(_compile.rec_select, out, pred, on_true, np.float32(b["on_false_value"]), b.get("mask"))
    return out


@_compile.instr
def select(*args, **kw):
    """``dst = where(predicate, on_true, on_false)`` (predicate: a tile or an index expression)."""
    is_new = (len(args) >= 4) or "dst" in kw
    b = _bind(args, kw, ("dst", "predicate", "on_true", "on_false"), ("predicate", "on_true", "on_false", "dtype",
                                                                      "mask"), is_new)
    pr = b["predicate"]
    pred = (np.asarray(nl._values(pr)) if isinstance(pr, NkiTensor) else np.asarray(pr)) != 0
    ot = b["on_true"]
    tv = nl._values(ot)
    fv = nl._values(b["on_false"])
    res = np.where(pred, tv, fv)
    out = _out(b.get("dst"), res, b.get("dtype") or nl._result_dtype(None, ot, b["on_false"]), "select",
               mask=b.get("mask"))
    _compile.record(_compile.rec_select, out, pr, ot, b["on_false"], b.get("mask"))
    return out


@_compile.instr
def tensor_copy_predicated(*args, **kw):
    is_new = (len(args) >= 3) or "dst" in kw
    b = _bind(args, kw, ("dst", "src", "predicate", "reverse_pred"), ("src", "predicate", "dst", "reverse_pred"),
              True)
    dst = _onchip(b["dst"], "dst", "tensor_copy_predicated")
    pred = np.asarray(nl._values(b["predicate"])).reshape(dst.shape) != 0
    if b.get("reverse_pred"):
        pred = ~pred
    src = b["src"]
    sv = np.asarray(nl._values(src)).reshape(dst.shape) if isinstance(src, NkiTensor) else np.float32(src)
    cur = dst.dtype.decode(dst.raw())
    dst.write(np.where(pred, sv, cur))
    _compile.record(_compile.rec_copy_predicated, dst, src, b["predicate"], bool(b.get("reverse_pred")))
    return dst


def tensor_scalar_reduce(*args, **kw):
    is_new = (len(args) >= 2 and _is_tensor(args[1])) or "dst" in kw
    b = _bind(args, kw, ("dst", "data", "op0", "operand0", "reduce_op", "reduce_res"),
              ("data", "op0", "operand0", "reduce_op", "reduce_res", "dtype"), is_new)
    data = _onchip(b["data"], "data", "tensor_scalar_reduce")
    p, nd = data.shape[0], data.ndim
    x = _apply(b["op0"], data.read(), _scalar_operand(b["operand0"], p, nd), b.get("reverse0", False))
    res = _out(b.get("dst"), x, b.get("dtype") or data.dtype, "tensor_scalar_reduce")
    rr = b.get("reduce_res")
    if rr is not None:
        red = _reducer(b["reduce_op"])(np.asarray(x, np.float32).reshape(p, -1), axis=1)
        if b.get("reduce_res_negate"):
            red = -red
        rr.write(red.reshape(rr.shape))
    return res


def tensor_tensor_scan(*args, **kw):
    """Per partition: ``res[:, i] = op1(op0(data0[:, i], res[:, i-1]), data1[:, i])`` from ``initial``."""
    is_new = (len(args) >= 3 and _is_tensor(args[2])) or "dst" in kw
    b = _bind(args, kw, ("dst", "data0", "data1", "initial", "op0", "op1", "reverse0", "reverse1"),
              ("data0", "data1", "initial", "op0", "op1", "dtype", "mask", "reverse0", "reverse1"), is_new)
    d0 = _onchip(b["data0"], "data0", "tensor_tensor_scan")
    d1 = _onchip(b["data1"], "data1", "tensor_tensor_scan")
    if d0.buffer is psum and d1.buffer is psum:
        raise error("nisa.tensor_tensor_scan: data0 and data1 cannot both be in PSUM")
    p = d0.shape[0]
    a = np.asarray(d0.read(), np.float32).reshape(p, -1)
    c = np.asarray(d1.read(), np.float32).reshape(p, -1)
    if c.shape != a.shape:
        raise error(f"nisa.tensor_tensor_scan: data0 {d0.shape} and data1 {d1.shape} differ in elements per partition")
    init = b["initial"]
    prev = (np.asarray(init.read(), np.float32).reshape(p) if isinstance(init, NkiTensor)
            else np.full(p, np.float32(init)))
    f0, f1 = _fn(b["op0"]), _fn(b["op1"])
    r0, r1 = b.get("reverse0", False), b.get("reverse1", False)
    out = np.empty_like(a)
    for i in range(a.shape[1]):
        t = f0(prev, a[:, i]) if r0 else f0(a[:, i], prev)
        prev = np.asarray(f1(c[:, i], t) if r1 else f1(t, c[:, i]), np.float32)
        out[:, i] = prev
    return _out(b.get("dst"), out.reshape(d0.shape), b.get("dtype") or d0.dtype, "tensor_tensor_scan",
                mask=b.get("mask"))


# older names of the engines
unknown_engine = engine.unknown
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd


def bn_stats(*args, **kw):
    """Per partition: (count, mean, var*count) of the even and of the odd elements (6 values), <= 512 in."""
    is_new = (len(args) >= 2) or "dst" in kw
    b = _bind(args, kw, ("dst", "data"), ("data", "dtype", "mask"), is_new)
    data = _onchip(b["data"], "data", "bn_stats")
    p = data.shape[0]
    x = np.asarray(data.read(), np.float32).reshape(p, -1)
    if x.shape[1] > 512:
        raise limit_error("bn_stats elements per partition (nl.tile_size.bn_stats_fmax)", x.shape[1], 512)
    out = np.zeros((p, 6), np.float32)
    for j, part in enumerate((x[:, 0::2], x[:, 1::2])):
        n = part.shape[1]
        if n:
            mean = part.mean(axis=1)
            out[:, 3 * j] = n
            out[:, 3 * j + 1] = mean
            out[:, 3 * j + 2] = ((part - mean[:, None]) ** 2).sum(axis=1)
    return _out(b.get("dst"), out, b.get("dtype") or _core.float32, "bn_stats")


def bn_aggr(*args, **kw):
    """Aggregates (count, mean, var*count) triples per partition into (mean, variance)."""
    is_new = (len(args) >= 2) or "dst" in kw
    b = _bind(args, kw, ("dst", "data"), ("data", "dtype", "mask"), is_new)
    data = _onchip(b["data"], "data", "bn_aggr")
    p = data.shape[0]
    x = np.asarray(data.read(), np.float64).reshape(p, -1)
    if x.shape[1] % 3:
        raise error(f"nisa.bn_aggr: {x.shape[1]} elements per partition is not a multiple of 3")
    t = x.reshape(p, -1, 3)
    cnt, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    total = cnt.sum(axis=1)
    safe = np.where(total > 0, total, 1)
    gmean = (cnt * mean).sum(axis=1) / safe
    var = (m2 + cnt * (mean - gmean[:, None]) ** 2).sum(axis=1) / safe
    return _out(b.get("dst"), np.stack([gmean, var], axis=1).astype(np.float32), b.get("dtype") or _core.float32,
                "bn_aggr")


def tensor_partition_reduce(*args, **kw):
    is_new = (args and _is_tensor(args[0])) or "dst" in kw
    b = _bind(args, kw, ("dst", "op", "data"), ("op", "data", "mask", "dtype"), is_new)
    data = _onchip(b["data"], "data", "tensor_partition_reduce", ("sbuf",))
    x = data.read()
    if x.dtype.kind not in "iub":
        x = x.astype(np.float32)
    r = _reducer(b["op"])(x, axis=0, keepdims=True)
    return _out(b.get("dst"), r, b.get("dtype") or data.dtype, "tensor_partition_reduce")


def max8(*args, **kw):
    is_new = (len(args) >= 2) or "dst" in kw
    b = _bind(args, kw, ("dst", "src"), ("src", "dtype", "mask"), is_new)
    src = _onchip(b["src"], "src", "max8")
    p = src.shape[0]
    x = np.asarray(src.read(), np.float32).reshape(p, -1)
    if not 8 <= x.shape[1] <= 16384:
        raise error(f"nisa.max8: {x.shape[1]} elements per partition, the instruction reads 8..16384")
    return _out(b.get("dst"), -np.sort(-x, axis=1)[:, :8], b.get("dtype") or src.dtype, "max8")


def exponential(*args, **kw):
    """``dst = exp(src - max_value)`` with the optional running sum of the Vector Engine (trn3)."""
    is_new = (len(args) >= 2) or "dst" in kw
    b = _bind(args, kw, ("dst", "src", "max_value", "reduce_res", "reduce_cmd", "reduce_init"),
              ("src", "max_value", "reduce_res", "reduce_cmd", "reduce_init", "dtype"), is_new)
    src = _onchip(b["src"], "src", "exponential")
    p, nd = src.shape[0], src.ndim
    x = np.asarray(src.read(), np.float32)
    mv = _scalar_operand(b.get("max_value", 0.0), p, nd)
    with np.errstate(all="ignore"):
        out = np.exp(x - mv)
    res = _out(b.get("dst"), out, b.get("dtype") or src.dtype, "exponential")
    cmd = b.get("reduce_cmd", reduce_cmd.idle)
    rres = b.get("reduce_res")
    if cmd != reduce_cmd.idle or rres is not None:
        inst = _regs()
        if cmd in (reduce_cmd.reset, reduce_cmd.reset_reduce):
            inst.reduce_regs[:] = 0
        if cmd == reduce_cmd.load_reduce:
            inst.reduce_regs[:p] = np.asarray(_scalar_operand(b.get("reduce_init", 0.0), p, 2), np.float32).reshape(-1)
        if cmd in (reduce_cmd.reduce, reduce_cmd.reset_reduce, reduce_cmd.load_reduce):
            inst.reduce_regs[:p] += out.reshape(p, -1).sum(axis=1)
        if rres is not None:
            rres.write(inst.reduce_regs[:p].reshape(rres.shape))
    return res


def dropout(*args, **kw):
    is_new = (len(args) >= 2 and _is_tensor(args[1])) or "dst" in kw
    b = _bind(args, kw, ("dst", "data", "prob"), ("data", "prob", "dtype", "mask"), is_new)
    data = _onchip(b["data"], "data", "dropout")
    x = np.asarray(data.read(), np.float32)
    pr = b["prob"]
    prob = float(np.asarray(pr.read()).reshape(-1)[0]) if isinstance(pr, NkiTensor) else float(pr)
    keep = np.random.random(x.shape) >= prob
    return _out(b.get("dst"), np.where(keep, x, 0.0), b.get("dtype") or data.dtype, "dropout")
