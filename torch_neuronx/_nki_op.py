"""NKI kernels as PyTorch custom operators: ``torch_neuronx.nki_op``.

Two forms, both returning a ``torch.library`` ``CustomOpDef`` (so ``register_autograd``, ``register_fake``,
``register_vmap`` ... work as for any custom op):

* **Around a typed function** (the form of AWS's TorchNeuron docs)::

      @torch_neuronx.nki_op("mylib::scale", mutates_args=())
      def scale(x: torch.Tensor, s: float) -> torch.Tensor:
          return scale_kernel[grid](x, s)          # any code that calls NKI kernels

  The schema comes from the annotations, as with ``torch.library.custom_op``.

* **Around an ``@nki.jit`` kernel** (``kernel`` or ``kernel[grid]``)::

      relu_op = torch_neuronx.nki_op("mylib::relu", relu_kernel, mutates_args=())
      relu_op = torch_neuronx.nki_op("mylib::relu", mutates_args=(), grid=lambda x: (x.shape[0] // 128,))(k)

  The schema comes from the kernel's parameters: a parameter is a ``Tensor`` unless its annotation
  (``float``/``int``/``bool``/``torch.Tensor``/``nki.typing.tensor``), its default value (``eps=1e-6`` is a
  ``float``) or ``types={"name": float}`` says otherwise; a default of ``None`` makes an optional ``Tensor?``.
  The op returns the kernel's ``returns`` HBM outputs (default: one if nothing is mutated, none otherwise;
  a custom op cannot return its own inputs, so an in-place kernel's op returns ``None``).

**Fake implementation** (output shapes and dtypes under ``torch.compile``/``FakeTensorMode``), first match wins:

1. ``op.register_fake(fn)`` afterwards, as for any custom op;
2. ``output_like="x"`` (or a tuple of names, one per output): outputs with that argument's shape and dtype;
   ``output_like=callable`` is used as the fake function itself;
3. otherwise **traced**: the function (or kernel) runs once on zero-filled CPU tensors of the fake
   arguments' shapes, dtypes and strides, in the numpy interpreter, and the outputs' shapes and dtypes are
   kept per argument signature. This costs one kernel run per new input signature at compile time (not per
   call). Kernels don't branch on data values, so zeros give the real shapes. With symbolic sizes
   (``dynamic=True``) the trace uses the sizes' hints and maps every output size equal to exactly one input
   size back to that symbol; an output size that cannot be mapped is an error asking for ``output_like``.

**Errors** name the op, the kernel and the argument: a tensor on a device the kernel cannot use, a dtype NKI
does not have, arguments on different devices, a kernel returning one of its inputs, a wrong number of
outputs; an ``nki.NkiError`` raised inside the kernel is re-raised with the op and kernel prefixed.
"""

from __future__ import annotations

import inspect
import threading
import typing
from typing import Any, Callable, Iterable, Optional

import torch

__all__ = ["nki_op"]

_SCALARS = {float: "float", int: "int", bool: "bool", str: "str"}


class _OpError(RuntimeError):
    pass


def _nki():
    try:
        import nki  # the top-level package shipped with the project (nki/ next to torch_neuronx/)
    except ImportError as e:
        raise ImportError("torch_neuronx.nki_op needs the project's `nki` package (the nki/ folder at the "
                          "repository root): reinstall the project (pip install -e .) or put the repository root "
                          "on PYTHONPATH") from e
    return nki


def _param_type(kname: str, p: inspect.Parameter, override: Optional[dict]) -> str:
    ann = (override or {}).get(p.name, p.annotation)
    if isinstance(ann, str):  # from __future__ annotations: resolve the names we know
        ann = {"float": float, "int": int, "bool": bool, "str": str, "torch.Tensor": torch.Tensor,
               "Tensor": torch.Tensor}.get(ann, ann)
    if ann in _SCALARS:
        return _SCALARS[ann]
    aname = getattr(ann, "name", None) if type(ann).__name__ == "_Annotation" else None  # nki.typing
    if aname in ("tensor", "mutable_tensor"):
        return "Tensor"
    if aname == "scalar":  # nt.scalar: the default's type if it has one, else float
        return _SCALARS.get(type(p.default), "float")
    if ann is torch.Tensor or getattr(ann, "__name__", "") in ("tensor", "Tensor", "NkiTensor"):
        return "Tensor"
    if typing.get_origin(ann) is typing.Union:
        inner = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(inner) == 1:
            return _param_type(kname, p.replace(annotation=inner[0]), None).rstrip("?") + "?"
    if ann is not inspect.Parameter.empty and ann is not Any:
        if not getattr(ann, "__module__", "").startswith("nki"):
            raise TypeError(f"nki_op (kernel {kname}): argument '{p.name}': cannot map annotation {ann!r} to a "
                            f"custom-op type; pass types={{'{p.name}': float | int | bool | torch.Tensor}}")
    if p.default is not inspect.Parameter.empty:
        if p.default is None:
            return "Tensor?"
        for t in (bool, int, float, str):
            if type(p.default) is t:
                return _SCALARS[t]
    return "Tensor"


def _kernel_schema(kname: str, fn: Callable, mutates: set, returns: int, types: Optional[dict]) -> str:
    sig = inspect.signature(fn)
    parts = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"nki_op (kernel {kname}): argument '{p.name}': *args/**kwargs kernels cannot be "
                            f"custom ops; give the kernel named parameters")
        t = _param_type(kname, p, types)
        if p.name in mutates:
            if not t.startswith("Tensor"):
                raise TypeError(f"nki_op (kernel {kname}): argument '{p.name}' is in mutates_args but is a {t}")
            alias = chr(ord("a") + sum("!" in x for x in parts))  # one alias set per mutated tensor
            t = f"Tensor({alias}!)" + t[len("Tensor"):]
        s = f"{t} {p.name}"
        if p.default is not inspect.Parameter.empty:
            s += "=" + ("None" if p.default is None else repr(p.default) if not isinstance(p.default, bool)
                        else str(p.default))
        parts.append(s)
    rets = "()" if returns == 0 else "Tensor" if returns == 1 else "(" + ", ".join(["Tensor"] * returns) + ")"
    return "(" + ", ".join(parts) + ") -> " + rets


def _concrete(n) -> int:
    if isinstance(n, torch.SymInt):
        hint = n.node.hint
        if hint is None:
            raise _OpError("a size without a hint")
        return int(hint)
    return int(n)


class _NkiOp:
    def __init__(self, name, target, mutates_args, grid, returns, output_like, types, kernel_mode):
        self.name = name
        self.target = target
        self.kernel_mode = kernel_mode
        self.kname = getattr(getattr(target, "fn", target), "__name__", repr(target))
        self.grid = grid
        self.output_like = output_like
        self.mutates = set(mutates_args)
        self.trace_cache: dict = {}
        self.trace_lock = threading.Lock()
        self.traced_runs = 0  # kernel runs spent on output-shape tracing (the tests read it)
        if kernel_mode:
            fn = target.fn
            sig = inspect.signature(fn)
            for p in sig.parameters.values():  # nt.mutable_tensor parameters are written in place
                if type(p.annotation).__name__ == "_Annotation" and p.annotation.name == "mutable_tensor":
                    self.mutates.add(p.name)
            for m in self.mutates:
                if m not in sig.parameters:
                    raise ValueError(f"nki_op {name} (kernel {self.kname}): mutates_args names '{m}', which is not "
                                     f"a parameter ({', '.join(sig.parameters)})")
            if returns is None:
                returns = 0 if self.mutates else 1
            self.returns = int(returns)
            schema = _kernel_schema(self.kname, fn, self.mutates, self.returns, types)
        else:
            schema = torch.library.infer_schema(target, mutates_args=self.mutates)
        self.schema_str = schema
        self.py_sig = inspect.signature(target.fn if kernel_mode else target)
        self.op = torch.library.custom_op(name, self._real, mutates_args=self.mutates, schema=schema)
        self.arg_names = [a.name for a in self.op._opoverload._schema.arguments]
        self.ret_count = len(self.op._opoverload._schema.returns)
        self.single = self.ret_count == 1 and not str(self.op._opoverload._schema.returns[0].type).startswith(
            ("List", "Tensor[]", "Optional[List"))
        self.op.register_fake(self._fake)
        self.op._nki = self  # introspection: op._nki.kname, op._nki.traced_runs
        self.op.__doc__ = getattr(target, "__doc__", None)

    # ---------------------------------------------------------------------------------------- helpers
    def _prefix(self, arg: Optional[str] = None) -> str:
        s = f"nki_op {self.name} (kernel {self.kname})"
        return s + (f": argument '{arg}'" if arg else "")

    def _normalize(self, args, kwargs):
        """All arguments positional, defaults filled in (the dispatcher leaves defaulted ones out)."""
        try:
            b = self.py_sig.bind(*args, **kwargs)
        except TypeError as e:
            raise _OpError(f"{self._prefix()}: {e}") from None
        b.apply_defaults()
        return tuple(b.args), dict(b.kwargs)

    def _bind(self, args, kwargs):
        named = list(zip(self.arg_names, args)) + [(k, v) for k, v in kwargs.items()]
        return named

    def _check_args(self, args, kwargs):
        nki = _nki()
        dev = None
        dev_arg = None
        for name, a in self._bind(args, kwargs):
            ts = [a] if isinstance(a, torch.Tensor) else [t for t in a if isinstance(t, torch.Tensor)] \
                if isinstance(a, (list, tuple)) else []
            for t in ts:
                if t.device.type not in ("neuron", "cpu"):
                    raise _OpError(f"{self._prefix(name)} is on {t.device}; NKI kernels run on neuron (or CPU) "
                                   f"tensors")
                try:
                    nki._core.to_dtype(t.dtype)
                except Exception:
                    raise _OpError(f"{self._prefix(name)} has dtype {t.dtype}, which NKI does not have") from None
                if dev is None:
                    dev, dev_arg = t.device, name
                elif t.device != dev:
                    raise _OpError(f"{self._prefix(name)} is on {t.device} but argument '{dev_arg}' is on {dev}; "
                                   f"all tensors of one kernel call must be on one device")

    def _grid_of(self, args, kwargs):
        g = self.grid
        if g is None:
            return None
        if callable(g):
            g = g(*args, **kwargs)
        return g if isinstance(g, tuple) else tuple(g) if isinstance(g, list) else (g,)

    def _run(self, args, kwargs):
        nki = _nki()
        try:
            if self.kernel_mode:
                k = self.target
                g = self._grid_of(args, kwargs)
                if g is not None:
                    k = k[g]
                return k(*args, **kwargs)
            return self.target(*args, **kwargs)
        except nki.NkiError as e:
            raise nki.NkiError(f"{self._prefix()}: {e}") from e

    def _outputs(self, res, args, kwargs):
        """The op's results from what the kernel returned: count checked, inputs never returned."""
        if self.ret_count == 0:
            return None
        outs = list(res) if isinstance(res, (tuple, list)) else [res]
        if self.kernel_mode and len(outs) != self.ret_count:
            raise _OpError(f"{self._prefix()}: the kernel returned {len(outs)} output(s), the op declares "
                           f"{self.ret_count} (returns=)")
        ptrs = {}
        for name, a in self._bind(args, kwargs):
            if isinstance(a, torch.Tensor) and a.numel():
                ptrs.setdefault(a.untyped_storage().data_ptr(), name)
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                raise _OpError(f"{self._prefix()}: output {i} is a {type(o).__name__}, not a tensor")
            if o.numel() and o.untyped_storage().data_ptr() in ptrs:
                arg = ptrs[o.untyped_storage().data_ptr()]
                raise _OpError(f"{self._prefix(arg)} is returned as output {i}: a custom op cannot return its "
                               f"inputs; declare it in mutates_args (the op then returns None) or return a new "
                               f"HBM tensor (nl.ndarray(..., buffer=nl.shared_hbm))")
        if self.kernel_mode:
            return outs[0] if self.ret_count == 1 else tuple(outs)
        return res

    # ---------------------------------------------------------------------------------- implementations
    def _real(self, *args, **kwargs):
        args, kwargs = self._normalize(args, kwargs)
        self._check_args(args, kwargs)
        res = self._run(args, kwargs)
        return self._outputs(res, args, kwargs)

    def _fake(self, *args, **kwargs):
        ol = self.output_like
        if callable(ol):
            return ol(*args, **kwargs)
        args, kwargs = self._normalize(args, kwargs)
        named = dict(self._bind(args, kwargs))
        dev = next((t.device for t in named.values() if isinstance(t, torch.Tensor)), torch.device("cpu"))
        if ol is not None:
            names = (ol,) if isinstance(ol, str) else tuple(ol)
            if len(names) != self.ret_count:
                raise _OpError(f"{self._prefix()}: output_like names {len(names)} argument(s), the op has "
                               f"{self.ret_count} output(s)")
            outs = []
            for n in names:
                if not isinstance(named.get(n), torch.Tensor):
                    raise _OpError(f"{self._prefix(n)}: output_like names it, but it is not a tensor argument")
                outs.append(torch.empty_like(named[n], memory_format=torch.contiguous_format))
            return None if not outs else outs[0] if self.single else tuple(outs)
        if self.ret_count == 0:
            return None
        specs = self._trace(args, kwargs)
        syms = {}
        for a in named.values():
            if isinstance(a, torch.Tensor):
                for s in a.shape:
                    if isinstance(s, torch.SymInt):  # SymInts are unhashable: keyed by their expression
                        syms.setdefault(_concrete(s), {})[str(s.node.expr)] = s
        outs = []
        for i, (shape, dtype) in enumerate(specs):
            size = []
            for d in shape:
                cands = syms.get(d)
                if cands is None:
                    size.append(d)
                elif len(cands) == 1:
                    size.append(next(iter(cands.values())))
                else:
                    raise _OpError(f"{self._prefix()}: output {i} has a size {d} that matches several symbolic "
                                   f"input sizes; pass output_like= (argument names or a fake function)")
            outs.append(torch.empty(size, dtype=dtype, device=dev))
        if self.single:
            return outs[0]
        return tuple(outs) if self.kernel_mode or isinstance(specs, tuple) else outs

    def _trace(self, args, kwargs):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        def key_of(a):
            if isinstance(a, torch.Tensor):
                return ("T", tuple(_concrete(s) for s in a.shape), tuple(_concrete(s) for s in a.stride()),
                        a.dtype)
            if isinstance(a, (list, tuple)):
                return tuple(key_of(x) for x in a)
            if isinstance(a, torch.SymInt):
                return _concrete(a)
            return a

        try:
            key = (tuple(key_of(a) for a in args), tuple(sorted((k, key_of(v)) for k, v in kwargs.items())))
            hash(key)
        except (TypeError, _OpError):
            raise _OpError(f"{self._prefix()}: cannot trace output shapes for these arguments; pass output_like= "
                           f"(argument names or a fake function)") from None
        with self.trace_lock:
            hit = self.trace_cache.get(key)
        if hit is not None:
            return hit

        def real(a):
            if isinstance(a, torch.Tensor):
                shape = [_concrete(s) for s in a.shape]
                stride = [_concrete(s) for s in a.stride()]
                t = torch.empty_strided(shape, stride, dtype=a.dtype, device="cpu")
                t.zero_()
                return t
            if isinstance(a, (list, tuple)):
                return type(a)(real(x) for x in a)
            if isinstance(a, torch.SymInt):
                return _concrete(a)
            if isinstance(a, torch.SymFloat):
                return float(a.node.hint)
            return a

        import numpy as np

        with unset_fake_temporarily(), torch.no_grad():
            rargs = [real(a) for a in args]
            rkw = {k: real(v) for k, v in kwargs.items()}
            with np.errstate(all="ignore"):
                res = self._run(rargs, rkw)
            self.traced_runs += 1
            res = self._outputs(res, rargs, rkw)
        outs = [res] if isinstance(res, torch.Tensor) else list(res)
        specs = tuple((tuple(o.shape), o.dtype) for o in outs)
        with self.trace_lock:
            if len(self.trace_cache) > 256:
                self.trace_cache.clear()
            self.trace_cache[key] = specs
        return specs


def nki_op(name: str, kernel: Optional[Callable] = None, *, mutates_args: Iterable[str] | str = (),
           grid: Any = None, returns: Optional[int] = None, output_like: Any = None,
           types: Optional[dict] = None):
    """Make ``kernel`` (an ``@nki.jit`` kernel, or a typed function calling kernels) the custom op ``name``
    (``"namespace::op"``). Usable as ``nki_op(name, kernel, ...)`` or as a decorator ``@nki_op(name, ...)``.

    - ``mutates_args``: names of the tensor arguments the kernel writes (``torch.library`` semantics).
    - ``grid``: the SPMD grid of a kernel: a tuple, an int, or ``callable(*args) -> tuple`` (kernel form).
      ``nki_op(name, kernel[4])`` keeps the kernel's own grid.
    - ``returns``: number of HBM tensors the kernel returns (kernel form; default 1, or 0 when mutating).
    - ``output_like``: argument name(s) whose shape and dtype the outputs have, or a fake function;
      default: outputs traced once per input signature (see the module docstring).
    - ``types``: ``{"param": float | int | bool | torch.Tensor}`` for unannotated kernel parameters.

    Returns the ``CustomOpDef`` (call it like the kernel; ``register_autograd`` adds a backward).
    """
    if isinstance(mutates_args, str):
        mutates_args = () if mutates_args == "unknown" else (mutates_args,)
    mutates_args = tuple(mutates_args)

    def make(target):
        nki = _nki()
        if isinstance(target, nki.Kernel):
            kernel_mode = True
        elif callable(target):
            kernel_mode = False
            if grid is not None or returns is not None or types is not None:
                raise TypeError(f"nki_op {name}: grid=/returns=/types= apply to an @nki.jit kernel; "
                                f"{getattr(target, '__name__', target)} is a plain function (launch the kernel "
                                f"with its grid inside it)")
        else:
            raise TypeError(f"nki_op {name}: expected an @nki.jit kernel or a function, got {target!r}")
        return _NkiOp(name, target, mutates_args, grid, returns, output_like, types, kernel_mode).op

    if kernel is not None:
        return make(kernel)
    return make
