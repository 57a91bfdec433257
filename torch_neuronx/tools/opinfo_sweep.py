"""OpInfo conformance sweep: every operator of PyTorch's OpInfo database, run on CPU and on neuron.

For each OpInfo in ``op_db``, each dtype of {float32, bfloat16, float16, int64, int32, bool} that the op
supports on CPU and each of its sample inputs, the op runs on CPU and on a neuron copy of the sample
(same strides, same storage sharing between arguments); outputs, arguments mutated in place, output
aliasing (views) and gradients are compared. Each sample gets one status:

- ``pass``: neuron matches CPU;
- ``mismatch``: both ran, results differ (values, dtype, shape, device or aliasing);
- ``error``: raises on neuron but not on CPU;
- ``crash``: the process died or timed out on the sample;
- ``skipped``: fails on CPU too, or its output is not comparable (random, undefined), or the input is of
  a layout the device does not support; the reason is recorded.

Crashes do not end the sweep: samples run in worker processes, each reporting one JSON line per sample
before starting the next; when a worker dies (or times out) the parent records a crash for the sample in
flight and starts a new worker at the next sample.

    python -m torch_neuronx.tools.opinfo_sweep                       # everything (long)
    python -m torch_neuronx.tools.opinfo_sweep --ops add,mm --dtypes float32,int64
    python -m torch_neuronx.tools.opinfo_sweep --op-range 0:100 --out part0   # split a long run
    python -m torch_neuronx.tools.opinfo_sweep --report part0.jsonl,part1.jsonl  # merge parts

Outputs: ``<out>.jsonl`` (one record per sample, written as results arrive), ``<out>.json`` (records
and per-op summary) and the markdown table (``--md``, default ``docs/opinfo_sweep.md``).
"""

import argparse
import collections
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
import warnings
import zlib

import torch_neuronx  # noqa: F401  (must precede torch.testing._internal: it registers the device)
import torch

STATUSES = ("pass", "mismatch", "error", "crash", "skipped")
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}
# (atol, rtol) when the OpInfo defines nothing larger: assert_close's defaults for float32, wider for the
# 16-bit types whose native kernels may round at other points than the CPU kernel.
DEFAULT_TOL = {
    torch.float32: (1e-5, 1.3e-6),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
}
SAMPLE_TIMEOUT = 60.0
DEVICE = "neuron"


def load_op_db():
    try:
        import expecttest  # noqa: F401
    except ImportError as e:
        raise SystemExit("opinfo_sweep needs the `expecttest` package (torch.testing._internal imports it): "
                         "pip install expecttest") from e
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def first_line(e, limit=300):
    text = f"{type(e).__name__}: {e}" if isinstance(e, BaseException) else str(e)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
    return line[:limit]


# ---- per-op metadata from the OpInfo ----------------------------------------------------------------

def _decorate_infos(op):
    for d in op.decorators or ():
        if hasattr(d, "decorators"):
            yield d, d.decorators
        else:
            yield None, [d]


def tolerance(op, dtype):
    """(atol, rtol): the largest override any of the OpInfo's tests allows for `dtype`, at least the default."""
    atol, rtol = DEFAULT_TOL.get(dtype, (0.0, 0.0))
    for info, decs in _decorate_infos(op):
        if info is not None and info.dtypes is not None and dtype not in info.dtypes:
            continue
        for d in decs:
            overrides = getattr(d, "d", None)
            if not isinstance(overrides, dict) or dtype not in overrides:
                continue
            t = overrides[dtype]
            if hasattr(t, "atol"):
                atol, rtol = max(atol, t.atol), max(rtol, t.rtol)
            elif isinstance(t, (int, float)):  # precisionOverride: an atol
                atol = max(atol, float(t))
    return atol, rtol


def incomparable_reason(op, dtype):
    """The OpInfo's reason for skipping its own device-against-CPU test (test_compare_cpu): random or
    undefined outputs, mostly. Only a mismatching sample is then skipped; matching ones still pass."""
    for info, decs in _decorate_infos(op):
        if info is None or info.test_name != "test_compare_cpu" or info.device_type not in (None, "cpu"):
            continue
        if info.dtypes is not None and dtype not in info.dtypes:
            continue
        if not info.active_if:
            continue
        for d in decs:
            for cell in getattr(d, "__closure__", None) or ():
                try:
                    v = cell.cell_contents
                except ValueError:
                    continue
                if isinstance(v, str):
                    return v
    return None


def op_dtypes(op, wanted):
    supported = op.supported_dtypes("cpu")
    return [name for name in wanted if DTYPES[name] in supported]


# ---- moving samples -----------------------------------------------------------------------------------

_NO_TEMPLATE = object()


def _is_meta_device(v):
    return (isinstance(v, torch.device) and v.type == "meta") or (isinstance(v, str) and v.startswith("meta"))


class Mover:
    """Copies a sample's tensors to `device` with the same sizes, strides, storage offsets and storage
    sharing between arguments, so views, expanded and overlapping arguments reach the device as they are.

    `template`, the same sample generated for the meta device, tells which tensors and device arguments
    follow the device under test (meta there) and which the op wants on CPU whatever the device (e.g.
    tensor_split's indices, to("cpu")). Without it, tensors and CPU device arguments all move."""

    def __init__(self, device, grad=True):
        self.device = torch.device(device)
        self.grad = grad
        self.storages = {}
        self.tensors = {}
        self.moved = 0  # tensors and device arguments sent to `device` (not kept on CPU)

    def tensor(self, t, device=None):
        n = self.tensors.get(id(t))
        if n is None:
            n = self._copy(t, device or self.device)
            self.tensors[id(t)] = n
        return n

    def _copy(self, t, device):
        plain = (t.layout == torch.strided and not t.is_quantized and not t.is_nested
                 and type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu")
        if not plain:
            n = t.detach().to(device)
            if n is t or (n.layout == torch.strided and t.layout == torch.strided and n.data_ptr() == t.data_ptr()):
                n = n.clone()
        else:
            st = t.untyped_storage()
            key = (st.data_ptr(), st.nbytes(), device.type)
            nb = self.storages.get(key)
            if nb is None:
                raw = torch.empty(0, dtype=torch.uint8).set_(st, 0, (st.nbytes(),), (1,))
                nb = raw.to(device, copy=True)
                self.storages[key] = nb
            # The storage holds the values before the conj/neg bits apply: set them again on the copy.
            n = torch.empty(0, dtype=t.dtype, device=device)
            n.set_(nb.untyped_storage(), t.storage_offset(), t.size(), t.stride())
            if t.is_neg():
                n = n._neg_view()
            if t.is_conj():
                n = n.conj()
        if self.grad and t.requires_grad:
            n.requires_grad_()
        return n

    def __call__(self, obj, template=_NO_TEMPLATE, key=None):
        guided = template is not _NO_TEMPLATE
        if isinstance(obj, torch.Tensor):
            if guided and isinstance(template, torch.Tensor) and template.device.type == "cpu":
                return self.tensor(obj, torch.device("cpu"))
            self.moved += 1
            return self.tensor(obj)
        if isinstance(obj, (torch.device, str)):
            if guided:
                follows = _is_meta_device(template)
            else:
                follows = ((isinstance(obj, torch.device) and obj.type == "cpu")
                           or (key == "device" and isinstance(obj, str) and obj.startswith("cpu")))
            if follows:
                self.moved += 1
                return self.device if isinstance(obj, torch.device) else str(self.device)
            return obj

        def sub(seq_t, i):
            if guided and isinstance(seq_t, (list, tuple)) and len(seq_t) == len(obj):
                return seq_t[i]
            return _NO_TEMPLATE

        if isinstance(obj, list):
            return [self(x, sub(template, i)) for i, x in enumerate(obj)]
        if type(obj) is tuple:
            return tuple(self(x, sub(template, i)) for i, x in enumerate(obj))
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self(x, sub(template, i)) for i, x in enumerate(obj)))
        if isinstance(obj, dict):
            tdict = template if guided and isinstance(template, dict) else {}
            return {k: self(v, tdict.get(k, _NO_TEMPLATE), k) for k, v in obj.items()}
        return obj


def tensor_leaves(obj, out=None):
    out = [] if out is None else out
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            tensor_leaves(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            tensor_leaves(x, out)
    return out


def unique(tensors):
    seen, out = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


# ---- comparison ---------------------------------------------------------------------------------------

class Mismatch(Exception):
    pass


def _dense_cpu(t):
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_quantized:
        t = t.dequantize()
    return t.resolve_conj().resolve_neg()


def compare(actual, expected, atol, rtol, path="output", device=DEVICE):
    """Raises Mismatch unless the neuron result `actual` equals the CPU result `expected`."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"{path}: expected a tensor, got {type(actual).__name__}")
        if device is not None and expected.device.type == "cpu" and actual.device.type != device:
            raise Mismatch(f"{path}: on {actual.device}, expected a {device} tensor")
        a, e = _dense_cpu(actual), _dense_cpu(expected)
        # The OpInfo's tolerance is for the sample's dtype; a result of another dtype (cos of an int64
        # tensor is float32) gets at least the default of its own.
        d_atol, d_rtol = DEFAULT_TOL.get(e.dtype, (0.0, 0.0))
        atol, rtol = max(atol, d_atol), max(rtol, d_rtol)
        try:
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True, check_device=False,
                                       check_layout=False)
        except AssertionError as err:
            msg = " ".join(ln.strip() for ln in str(err).splitlines() if ln.strip())
            raise Mismatch(f"{path}: {msg}") from None
        return
    if isinstance(expected, (list, tuple)) and not isinstance(expected, torch.Size):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise Mismatch(f"{path}: expected a sequence of {len(expected)}, got {type(actual).__name__}"
                           f" {len(actual) if isinstance(actual, (list, tuple)) else ''}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, atol, rtol, f"{path}[{i}]", device)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise Mismatch(f"{path}: expected keys {sorted(map(str, expected))}")
        for k in expected:
            compare(actual[k], expected[k], atol, rtol, f"{path}[{k!r}]", device)
        return
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        if math.isnan(expected) and math.isnan(actual):
            return
        if abs(actual - expected) <= atol + rtol * abs(expected) or actual == expected:
            return
        raise Mismatch(f"{path}: {actual!r} != {expected!r}")
    if isinstance(expected, complex) and isinstance(actual, complex):
        if actual == expected or abs(actual - expected) <= atol + rtol * abs(expected):
            return
        raise Mismatch(f"{path}: {actual!r} != {expected!r}")
    if actual != expected:
        raise Mismatch(f"{path}: {actual!r} != {expected!r}")


def alias_sets(outputs, inputs):
    """For each output tensor, the indices of the input tensors whose storage it shares."""
    def key(t):
        if t.layout != torch.strided or t.is_nested:
            return None
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None
        return st.data_ptr() if st.nbytes() and st.data_ptr() else None

    in_keys = [key(t) for t in inputs]
    res = []
    for o in outputs:
        k = key(o)
        res.append(frozenset(i for i, ik in enumerate(in_keys) if k is not None and ik == k))
    return res


# ---- running one sample -------------------------------------------------------------------------------

def _seed(*parts):
    return zlib.crc32("/".join(map(str, parts)).encode()) & 0x7FFFFFFF


def _call(fn, sample_args):
    inp, args, kwargs = sample_args
    return fn(inp, *args, **kwargs)


def _grads(outputs, inputs, seed, device):
    """Gradients of the outputs' floating parts wrt `inputs`, for random grad_outputs made from `seed` on
    CPU (so both devices use the same values). None when nothing is differentiable."""
    outs = [t for t in tensor_leaves(outputs)
            if t.requires_grad and (t.is_floating_point() or t.is_complex())]
    if not outs or not inputs:
        return None
    g = torch.Generator().manual_seed(seed)
    gos = [torch.randn(t.shape, generator=g, dtype=t.dtype).to(device) for t in outs]
    return list(torch.autograd.grad(outs, inputs, gos, allow_unused=True))


def _as_close_as_cpu(fn, cpu_args, process, cpu_req, seed, dev_grads, cpu_grads, atol, rtol):
    """Arbitrates a gradient mismatch with the exact answer: the sample rerun on CPU in float64 (the same
    inputs and grad_outputs, widened). Cancellation in a backward (a layer_norm over one element, a pow
    near 0) turns one rounding into a large relative error on CPU too; neuron is right where each of its
    elements is no further from the float64 gradient than CPU's element is, plus the tolerance."""
    wide = {}

    def widen(obj):
        if isinstance(obj, torch.Tensor):
            if id(obj) not in wide:
                t = obj.detach()
                if t.dtype in (torch.float16, torch.bfloat16, torch.float32):
                    t = t.double()
                else:
                    t = t.clone()
                wide[id(obj)] = t.requires_grad_(obj.requires_grad)
            return wide[id(obj)]
        if isinstance(obj, (list, tuple)):
            return type(obj)(widen(x) for x in obj) if not hasattr(obj, "_fields") else type(obj)(*map(widen, obj))
        if isinstance(obj, dict):
            return {k: widen(v) for k, v in obj.items()}
        return obj

    try:
        args64 = widen(cpu_args)
        req64 = [wide[id(t)] for t in cpu_req]
        torch.manual_seed(seed)
        outs = [t for t in tensor_leaves(process(_call(fn, cpu_args)))
                if t.requires_grad and (t.is_floating_point() or t.is_complex())]
        torch.manual_seed(seed)
        outs64 = [t for t in tensor_leaves(process(_call(fn, args64)))
                  if t.requires_grad and (t.is_floating_point() or t.is_complex())]
        if len(outs) != len(outs64):
            return False
        # The grad_outputs of _grads: drawn in the original dtype, then widened.
        g = torch.Generator().manual_seed(seed)
        gos = [torch.randn(t.shape, generator=g, dtype=t.dtype).to(t64.dtype) for t, t64 in zip(outs, outs64)]
        grads64 = torch.autograd.grad(outs64, req64, gos, allow_unused=True)
    except Exception:  # noqa: BLE001  (no float64 kernel, say): no arbiter, the mismatch stands
        return False
    no_reference = False
    for d, c, r in zip(dev_grads, cpu_grads, grads64):
        if d is None or c is None or r is None:
            if (d is None) != (c is None):
                return False
            continue
        d, c, r = (_dense_cpu(x).to(torch.float64) for x in (d, c, r))
        if d.shape != r.shape or c.shape != r.shape:
            return False
        ok = ((d - r).abs() <= (c - r).abs() + atol + rtol * r.abs()) | (d == c) | (d.isnan() & c.isnan())
        if bool(ok.all()):
            continue
        # Where the float64 gradient is NaN (undefined at these inputs: a QR of a rank-deficient matrix) or
        # CPU's float32 gradient has no correct digit (further from the float64 one than its magnitude: a
        # pseudo-inverse inverting rounding noise), CPU's value is no reference: such elements are not CPU
        # passes. Every other element must still be as close as CPU's.
        err = (c - r).abs()
        wrong = r.isnan() | (err > r.abs() + atol) | (err.isnan() & (c != r))
        if not bool((ok | wrong).all()):
            return False
        no_reference = True
    return CPU_GRAD_WRONG if no_reference else True


# _as_close_as_cpu's verdict when the elements that differ are ones where CPU's gradient is no reference.
CPU_GRAD_WRONG = "cpu-gradient-wrong"


def _expected_devices(fn, template, n):
    """Device types the op's n output tensors should have on the device under test: where the op puts
    them when run on the meta template (meta: the device under test; cpu: CPU whatever the device), or
    None when that cannot be told."""
    if template is _NO_TEMPLATE:
        return None
    try:
        with torch.no_grad():
            inp, args, kwargs = _clone_tree(template)
            outs = tensor_leaves(fn(inp, *args, **kwargs))
    except Exception:  # noqa: BLE001  (no meta kernel): fall back to the caller's rule
        return None
    if len(outs) != n:
        return None
    return [DEVICE if o.device.type == "meta" else o.device.type for o in outs]


def _clone_tree(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, list):
        return [_clone_tree(x) for x in obj]
    if type(obj) is tuple:
        return tuple(_clone_tree(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _clone_tree(v) for k, v in obj.items()}
    return obj


_SEEDED = {}


def random_ops(op_names):
    """The aten operators among `op_names` ("aten::normal_", "aten::add.out") that draw random numbers
    (tag nondeterministic_seeded): neuron's generator differs from CPU's, so their values differ."""
    out = []
    for name in op_names:
        if name not in _SEEDED:
            ns, _, rest = name.partition("::")
            base, _, overload = rest.partition(".")
            try:
                packet = getattr(getattr(torch.ops, ns), base)
                tags = getattr(packet, overload or "default").tags
                _SEEDED[name] = torch.Tag.nondeterministic_seeded in tags
            except Exception:  # noqa: BLE001
                _SEEDED[name] = False
        if _SEEDED[name]:
            out.append(name)
    return out


def _unsupported_input(sample_args):
    for t in tensor_leaves(list(sample_args)):
        if t.layout != torch.strided:
            return f"{t.layout} inputs"
        if t.is_quantized:
            return f"quantized {t.dtype} inputs"
        if t.is_nested:
            return "nested tensors"
    return None


# Operators whose CPU kernels fix the values but not which of several equal elements' indices come
# first (topk; sort unless stable=True): name -> (position of dim among the positional args, its default).
_TIE_ORDER = {"topk": (1, -1), "sort": (0, -1)}


def _ties_as_values(op_name, sample_args, out):
    """(values, indices) of an op in _TIE_ORDER with the indices replaced by the elements they select,
    so two results compare equal exactly when they agree on everything the CPU specifies."""
    spec = _TIE_ORDER.get(op_name)
    if spec is None or not isinstance(out, (tuple, list)) or len(out) != 2:
        return out
    inp, args, kwargs = sample_args
    if op_name == "sort" and kwargs.get("stable"):
        return out
    values, indices = out
    if not isinstance(inp, torch.Tensor) or not isinstance(indices, torch.Tensor) or inp.dim() == 0:
        return out
    pos, default = spec
    dim = kwargs.get("dim", args[pos] if len(args) > pos else default)
    return (values, inp.detach().gather(dim, indices))


def _ties_chosen_differently(op_name, actual, expected):
    """Whether an op in _TIE_ORDER picked other indices than the CPU (among equal values: the outputs
    compared equal): its gradient then flows to other, equally valid, elements."""
    if op_name not in _TIE_ORDER or not isinstance(expected, (tuple, list)) or len(expected) != 2:
        return False
    return not torch.equal(actual[1].cpu(), expected[1])


# ---- forms: each sample also runs in other layouts, and through its out= variant -------------------

FORMS = ("as_built", "noncontiguous", "channels_last", "expanded")
FORMS_ENV = "TORCH_NEURONX_SWEEP_FORMS"


def selected_forms():
    """The forms to run ($TORCH_NEURONX_SWEEP_FORMS: "all" or a comma list; default as_built only)."""
    v = os.environ.get(FORMS_ENV, "as_built").strip()
    if v == "all":
        return FORMS
    forms = tuple(f for f in v.split(",") if f)
    bad = [f for f in forms if f not in FORMS]
    if bad:
        raise SystemExit(f"unknown forms {bad}; choose from {','.join(FORMS)} or all")
    return forms


def _relayout(f):
    """A SampleInput.transform function applying f to tensors, keeping them leaves with their requires_grad."""
    def apply(t):
        if not isinstance(t, torch.Tensor):
            return t
        r = f(t.detach())
        if r is None:
            return t
        return r.requires_grad_(t.requires_grad) if r.is_floating_point() or r.is_complex() else r
    return apply


def _channels_last(t):
    if t.dim() == 4:
        return t.clone(memory_format=torch.channels_last)
    if t.dim() == 5:
        return t.clone(memory_format=torch.channels_last_3d)
    return None


def form_of(sample, form):
    """`sample` in `form`, or None when the form changes nothing for it (no tensor it applies to)."""
    if sample is None or form == "as_built":
        return sample
    leaves = tensor_leaves([sample.input, list(sample.args), sample.kwargs])
    if form == "noncontiguous":
        if not any(t.numel() > 1 for t in leaves):
            return None
        return sample.noncontiguous()
    if form == "channels_last":
        if not any(t.dim() in (4, 5) and t.numel() > 1 for t in leaves):
            return None
        return sample.transform(_relayout(_channels_last))
    if form == "expanded":
        # The input's first row broadcast over dim 0 (stride 0): both devices get the same values.
        x = sample.input
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] < 2:
            return None
        s = sample.transform(lambda t: t)
        s.input = x.detach()[:1].clone().expand(x.shape).requires_grad_(x.requires_grad)
        return s
    raise ValueError(form)


def _out_variant(op):
    """op called with out= tensors (zeros of the functional result's shapes and dtypes); returns them."""
    def call(*args, **kwargs):
        r = op.op(*args, **kwargs)
        if isinstance(r, torch.Tensor):
            out = torch.zeros_like(r, memory_format=torch.contiguous_format)
        elif isinstance(r, (tuple, list)) and r and all(isinstance(x, torch.Tensor) for x in r):
            out = tuple(torch.zeros_like(x, memory_format=torch.contiguous_format) for x in r)
        else:
            raise TypeError(f"{op.name}: no tensor output to pass as out=")
        op.op(*args, **kwargs, out=out)
        return out
    return call


def run_case(op, dtype, sample, variant, seed, tol, counts_out, template=None):
    """Runs one sample on CPU and neuron; returns (status, message). `template`: the sample made for meta.
    `variant` is fn, inplace or out, followed by @form for a sample in another form than built."""
    atol, rtol = tol
    kind = variant.split("@")[0]
    fn = {"fn": op.op, "inplace": op.inplace_variant, "out": _out_variant(op)}[kind]
    grad = kind == "fn"
    cpu_args = (sample.input, tuple(sample.args), dict(sample.kwargs))
    if not grad:
        cpu_args = Mover("cpu", grad=False)(cpu_args)
    # Copies made before the CPU run: the op may modify its arguments.
    tmpl = _NO_TEMPLATE
    if template is not None:
        tmpl = (template.input, tuple(template.args), dict(template.kwargs))
    try:
        dev_mover = Mover(DEVICE, grad=grad)
        dev_args = dev_mover(cpu_args, tmpl)
    except Exception as e:  # noqa: BLE001
        bad = _unsupported_input(cpu_args)
        if bad:
            return "skipped", f"unsupported on {DEVICE}: {bad} ({first_line(e)})"
        return "error", "moving the sample: " + first_line(e)
    check_args = Mover("cpu", grad=False)(cpu_args)
    # A sample in another form than built: the same values, contiguous, made before the CPU run, to tell
    # whether CPU's own result depends on the layout (a CPU kernel reading a stride-0 input wrongly).
    contig = _contiguous_copy(cpu_args) if "@" in variant else None

    cpu_inputs = unique(tensor_leaves(list(cpu_args)))
    dev_inputs = [dev_mover.tensors[id(t)] for t in cpu_inputs]
    cpu_req = [t for t in cpu_inputs if t.requires_grad]
    dev_req = [dev_mover.tensors[id(t)] for t in cpu_req]

    torch.manual_seed(seed)
    try:
        expected_raw = _call(fn, cpu_args)
    except Exception as e:  # noqa: BLE001
        return "skipped", "fails on CPU: " + first_line(e)
    process = sample.output_process_fn_grad if grad else (lambda x: x)
    expected = process(expected_raw)

    # Random ops: the same op on a copy of the sample under another seed must give the same result.
    torch.manual_seed(seed + 1)
    try:
        with torch.no_grad():
            again = process(_call(fn, check_args))
        compare(again, expected, atol, rtol, device="cpu")
    except Mismatch as m:
        return "skipped", "nondeterministic on CPU (" + str(m)[:150] + ")"
    except Exception:  # noqa: BLE001  (e.g. an op that consumes its input): nothing to learn
        pass

    cpu_grads, grad_note = None, ""
    if grad and cpu_req:
        try:
            cpu_grads = _grads(expected, cpu_req, seed, "cpu")
        except Exception as e:  # noqa: BLE001
            grad_note = " (backward fails on CPU: " + first_line(e, 100) + ")"

    torch_neuronx.reset_op_counts()
    stage = "forward"
    try:
        torch.manual_seed(seed)
        actual_raw = _call(fn, dev_args)
        actual = process(actual_raw)
        if cpu_grads is not None:
            stage = "backward"
            dev_grads = _grads(actual, dev_req, seed, DEVICE)
        torch.neuron.synchronize()
    except Exception as e:  # noqa: BLE001
        counts_out.update(torch_neuronx.op_counts())
        bad = _unsupported_input(cpu_args) or _unsupported_input([expected_raw])
        if bad:
            return "skipped", f"unsupported on {DEVICE}: {bad} ({first_line(e)})"
        return "error", f"{stage}: " + first_line(e)
    finally:
        counts_out.update(torch_neuronx.op_counts())

    out_cpu, out_dev = tensor_leaves(expected_raw), tensor_leaves(actual_raw)
    devices = _expected_devices(fn, tmpl, len(out_cpu))
    if devices is None:
        # An op given no neuron tensor and no device (e.g. arange(3)) rightly returns CPU tensors.
        devices = [DEVICE if dev_mover.moved else "cpu"] * len(out_cpu)
    try:
        if len(out_cpu) == len(out_dev):
            for i, (d, want) in enumerate(zip(out_dev, devices)):
                if d.device.type != want:
                    raise Mismatch(f"output tensor {i}: on {d.device}, expected a {want} tensor")
        compare(_ties_as_values(op.name, dev_args, actual), _ties_as_values(op.name, cpu_args, expected), atol, rtol,
                device=None)
        if len(out_cpu) == len(out_dev):
            for i, (ac, ad) in enumerate(zip(alias_sets(out_cpu, cpu_inputs), alias_sets(out_dev, dev_inputs))):
                if ac != ad:
                    raise Mismatch(f"output tensor {i} shares storage with inputs {sorted(ad)} on {DEVICE}, "
                                   f"{sorted(ac)} on CPU")
        if not grad and isinstance(expected_raw, torch.Tensor) and expected_raw is cpu_args[0]:
            if actual_raw is not dev_args[0]:
                raise Mismatch("in-place variant did not return its input")
        for i, (d, c) in enumerate(zip(dev_inputs, cpu_inputs)):
            compare(d, c, atol, rtol, f"argument {i} after the call", device=d.device.type)
        if cpu_grads is not None:
            if _ties_chosen_differently(op.name, actual, expected):
                grad_note += " (gradient not compared: equal elements' indices chosen differently, both valid)"
            else:
                try:
                    compare(dev_grads, cpu_grads, atol, rtol, "gradient")
                except Mismatch as gm:
                    verdict = _as_close_as_cpu(fn, cpu_args, process, cpu_req, seed, dev_grads, cpu_grads, atol, rtol)
                    if not verdict:
                        raise
                    if verdict == CPU_GRAD_WRONG:
                        return "skipped", ("CPU's gradient is no reference: where neuron's differs, the float64 "
                                           "gradient is undefined (NaN) or CPU's float32 one is further from it than "
                                           f"its magnitude; elsewhere neuron is as close as CPU ({gm})")[:400]
                    grad_note += (" (gradient differs from CPU's by more than the tolerance, but is no further from "
                                  "the float64 gradient than CPU's is, plus the tolerance)")
    except Mismatch as m:
        rng = random_ops(counts_out)
        if rng:
            return "skipped", f"random: uses {', '.join(rng[:3])}, whose values differ from CPU's generator ({m})"[:400]
        if contig is not None:
            verdict = _cpu_form_inconsistency(
                op.name, fn, contig, process, seed, grad and cpu_grads is not None, atol, rtol,
                (cpu_args, expected, cpu_inputs, cpu_req, cpu_grads),
                (dev_args, actual, dev_inputs, dev_grads if cpu_grads is not None else None))
            if verdict is not None:
                status, why = verdict
                return status, why[:400]
        return "mismatch", str(m)[:400]
    return "pass", grad_note.strip()


class _Contiguous(Mover):
    """Mover's walk over a sample, each tensor replaced by a contiguous CPU copy of its values (the same copy
    for the same tensor, requires_grad kept)."""

    def __init__(self):
        super().__init__("cpu")

    def _copy(self, t, device):
        d = t.detach()
        plain = d.layout == torch.strided and not d.is_quantized and not d.is_nested
        c = d.clone(memory_format=torch.contiguous_format) if plain else d.clone()
        return c.requires_grad_(t.requires_grad)


def _contiguous_copy(cpu_args):
    """(args, {id(tensor): copy}): `cpu_args` with every tensor replaced by a contiguous copy of its values."""
    m = _Contiguous()
    return m(cpu_args), m.tensors


def _cpu_form_inconsistency(op_name, fn, contig, process, seed, with_grads, atol, rtol, cpu, dev):
    """A sample in another form than built whose neuron result differs from CPU's: reruns CPU on the
    contiguous copy of the same values. If CPU's result in the form differs from that, the sample is not
    one that passes on CPU (its kernel depends on the layout, e.g. reads a stride-0 input wrongly): returns
    ("skipped", why) when neuron matches the contiguous CPU result, ("mismatch", why) when it matches
    neither. None when CPU is consistent (the mismatch stands as it is) or the rerun fails."""
    (cpu_args, expected, cpu_inputs, cpu_req, cpu_grads), (dev_args, actual, dev_inputs, dev_grads) = cpu, dev
    args_c, memo = contig
    try:
        torch.manual_seed(seed)
        ref = process(_call(fn, args_c))
        ref_inputs = [memo[id(t)] for t in cpu_inputs]
        ref_grads = _grads(ref, [memo[id(t)] for t in cpu_req], seed, "cpu") if with_grads else None
    except Exception:  # noqa: BLE001
        return None

    def check(out, args, inputs, grads, arbiter):
        compare(_ties_as_values(op_name, args, out), _ties_as_values(op_name, args_c, ref), atol, rtol, device=None)
        for i, (x, r) in enumerate(zip(inputs, ref_inputs)):
            compare(x, r, atol, rtol, f"argument {i} after the call", device=None)
        if ref_grads is not None and not _ties_chosen_differently(op_name, out, ref):
            try:
                compare(grads, ref_grads, atol, rtol, "gradient", device=None)
            except Mismatch:
                if not (arbiter and _as_close_as_cpu(fn, cpu_args, process, cpu_req, seed, grads, ref_grads,
                                                     atol, rtol)):
                    raise

    try:
        check(expected, cpu_args, cpu_inputs, cpu_grads, False)
        return None
    except Mismatch as m:
        cpu_differs = str(m)[:150]
    try:
        check(actual, dev_args, dev_inputs, dev_grads, True)
    except Mismatch as m:
        return "mismatch", (f"neuron matches neither CPU's result in this form nor CPU's result on a contiguous "
                            f"copy of the same values, which differ ({cpu_differs[:100]}): {str(m)[:150]}")
    return "skipped", (f"inconsistent on CPU: its result in this form differs from its result on a contiguous "
                       f"copy of the same values ({cpu_differs}); neuron matches the contiguous result")


def cases_of(op, dtype_name, max_samples=None):
    """The deterministic list of (sample, variant) cases of one op and dtype."""
    dtype = DTYPES[dtype_name]
    req = (op.supports_autograd and dtype.is_floating_point
           and dtype in op.supported_backward_dtypes("cpu"))
    seed = _seed(op.full_name, dtype_name)
    torch.manual_seed(seed)
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    samples = []
    for s in op.sample_inputs("cpu", dtype, requires_grad=req):
        samples.append(s)
        if max_samples and len(samples) >= max_samples:
            break
    random.seed(seed)  # sample functions that draw shapes from `random` make the same ones for meta
    np.random.seed(seed)
    templates = _meta_templates(op, dtype, req, len(samples))
    cases = []
    for i, s0 in enumerate(samples):
        t0 = templates[i] if templates else None
        for form in selected_forms():
            try:
                s = form_of(s0, form)
                t = form_of(t0, form) if s is not None else None
            except Exception:  # noqa: BLE001  (a sample the form cannot be applied to)
                continue
            if s is None:
                continue
            suffix = "" if form == "as_built" else "@" + form
            cases.append((i, "fn" + suffix, s, t))
            if op.inplace_variant is not None and not s.broadcasts_input and form != "expanded":
                cases.append((i, "inplace" + suffix, s, t))
            if op.supports_out and form == "as_built" and "out" not in s.kwargs:
                cases.append((i, "out", s, t))
    return cases


def _meta_templates(op, dtype, req, n):
    """The first n samples made for the meta device (see Mover), or None when they cannot be made or
    do not line up with the CPU samples."""
    out = []
    try:
        for s in op.sample_inputs("meta", dtype, requires_grad=req):
            out.append(s)
            if len(out) >= n:
                break
    except Exception:  # noqa: BLE001
        return None
    if len(out) != n:
        return None
    for s in out:
        for t in tensor_leaves([s.input, list(s.args), s.kwargs]):
            if t.device.type not in ("meta", "cpu"):
                return None
    return out


def _inject_fault(op_name, dtype_name, case):
    """Testing the isolation: TORCH_NEURONX_SWEEP_FAULT=op/dtype/case/{abort,hang} kills or hangs the
    process at that case."""
    spec = os.environ.get("TORCH_NEURONX_SWEEP_FAULT")
    if not spec:
        return
    o, d, c, kind = spec.rsplit("/", 3)
    if (o, d, int(c)) != (op_name, dtype_name, case):
        return
    if kind == "abort":
        os.abort()
    while kind == "hang":
        time.sleep(1)


def run_unit(op, dtype_name, start=0, max_samples=None, emit=None):
    """Runs the cases of one op and dtype from index `start`; yields one record per case. `emit` (if
    given) is called with ("begin", case_index, variant) before each case runs."""
    dtype = DTYPES[dtype_name]
    base = {"op": op.full_name, "dtype": dtype_name}
    reason = incomparable_reason(op, dtype)
    try:
        cases = cases_of(op, dtype_name, max_samples)
    except Exception as e:  # noqa: BLE001
        yield dict(base, case=-1, sample=-1, variant="fn", status="skipped",
                   msg="sample generation fails on CPU: " + first_line(e))
        return
    tol = tolerance(op, dtype)
    for k in range(start, len(cases)):
        i, variant, sample, template = cases[k]
        if emit:
            emit("begin", k, variant)
        counts = {}
        _inject_fault(op.full_name, dtype_name, k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                status, msg = run_case(op, dtype, sample, variant, _seed(op.full_name, dtype_name, k), tol, counts,
                                       template)
            except Exception as e:  # noqa: BLE001  (a bug of this tool, reported, not hidden)
                status, msg = "error", "sweep: " + first_line(e) + " " + traceback.format_exc(limit=-1)[-200:]
        if status == "mismatch" and reason:
            # The OpInfo itself says this op's outputs are not comparable across devices (random or
            # undefined values); samples that match anyway still count as passes.
            status, msg = "skipped", f"not comparable ({reason}): {msg}"
        rec = dict(base, case=k, sample=i, variant=variant, status=status, msg=msg)
        rec["native"] = sorted(o for o, c in counts.items() if c["native"])
        rec["fallback"] = sorted(o for o, c in counts.items() if c["fallback"])
        yield rec


# ---- worker and parent --------------------------------------------------------------------------------

def worker_main():
    """Reads units (JSON lines) on stdin; writes begin/result/done JSON lines on the original stdout."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the ops print goes to stderr, not into the protocol
    sys.stdout = sys.stderr
    op_db = load_op_db()
    by_name = {op.full_name: op for op in op_db}

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    send({"ev": "ready"})
    for line in sys.stdin:
        unit = json.loads(line)
        op = by_name[unit["op"]]
        for rec in run_unit(op, unit["dtype"], unit.get("start", 0), unit.get("max"),
                            emit=lambda ev, k, v: send({"ev": ev, "case": k, "variant": v})):
            send({"ev": "result", "rec": rec})
        send({"ev": "done"})


class Worker:
    def __init__(self, env_extra=None):
        env = dict(os.environ)
        env.update(env_extra or {})
        env.setdefault("PYTHONWARNINGS", "ignore")
        self.stderr = open(_tmp_path("worker-stderr"), "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch_neuronx.tools.opinfo_sweep", "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env,
            start_new_session=True, text=True)
        self.buf = b""
        self.unit = None
        self.inflight = None
        self.last = time.monotonic()
        self.ready = False

    def send(self, unit):
        self.unit = unit
        self.inflight = None
        self.last = time.monotonic()
        self.proc.stdin.write(json.dumps(unit) + "\n")
        self.proc.stdin.flush()

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stderr_tail(self):
        self.stderr.flush()
        self.stderr.seek(0)
        lines = [ln.strip() for ln in self.stderr.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:200] if lines else ""

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self.kill()
        name = self.stderr.name
        self.stderr.close()
        try:
            os.unlink(name)
        except OSError:
            pass


_tmp_counter = [0]


def _tmp_path(stem):
    import tempfile

    _tmp_counter[0] += 1
    return os.path.join(tempfile.gettempdir(), f"opinfo-sweep-{os.getpid()}-{_tmp_counter[0]}-{stem}")


def run_isolated(units, jobs=1, timeout=SAMPLE_TIMEOUT, on_record=None, log=None):
    """Runs units ({"op", "dtype", "start", "max"}) in worker processes; returns the records."""
    pending = collections.deque(units)
    records = []
    sel = selectors.DefaultSelector()
    workers = []

    def record(rec):
        records.append(rec)
        if on_record:
            on_record(rec)

    def start_worker():
        w = Worker()
        workers.append(w)
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        return w

    def give(w):
        if pending:
            w.send(pending.popleft())
        else:
            w.unit = None

    def fail(w, why):
        """The worker died or hung: a crash for the case in flight, then the rest of its unit elsewhere."""
        unit = w.unit
        tail = w.stderr_tail()
        sel.unregister(w.proc.stdout)
        w.kill()
        w.close()
        workers.remove(w)
        if unit is not None:
            k, variant = w.inflight if w.inflight else (-1, "fn")
            msg = why + (f" ({tail})" if tail else "")
            record({"op": unit["op"], "dtype": unit["dtype"], "case": k, "sample": None, "variant": variant,
                    "status": "crash", "msg": msg[:400], "native": [], "fallback": []})
            if k >= 0:
                pending.appendleft(dict(unit, start=k + 1))
        if pending or any(x.unit for x in workers):
            if pending:
                start_worker()

    for _ in range(max(1, min(jobs, len(units)))):
        start_worker()
    while workers:
        events = sel.select(timeout=1.0)
        for key, _ in events:
            w = key.data
            # Unbuffered reads: a buffered readline would leave lines in its buffer, unseen by select.
            chunk = os.read(w.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                w.proc.wait()
                rc = w.proc.returncode
                why = f"worker died (signal {signal.Signals(-rc).name})" if rc < 0 else f"worker exited ({rc})"
                fail(w, why)
                continue
            w.buf += chunk
            *lines, w.buf = w.buf.split(b"\n")
            w.last = time.monotonic()
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                ev = msg.get("ev")
                if ev == "ready":
                    w.ready = True
                    give(w)
                elif ev == "begin":
                    w.inflight = (msg["case"], msg["variant"])
                elif ev == "result":
                    w.inflight = None
                    record(msg["rec"])
                elif ev == "done":
                    give(w)
            if w.ready and w.unit is None and not pending:
                sel.unregister(w.proc.stdout)
                w.close()
                workers.remove(w)
        now = time.monotonic()
        for w in list(workers):
            limit = timeout if w.ready else max(timeout, 120.0)
            if now - w.last > limit and (w.unit is not None or not w.ready):
                fail(w, f"timeout after {limit:.0f} s")
    return records


# ---- reports ------------------------------------------------------------------------------------------

def summarize(records):
    ops = collections.OrderedDict()
    for r in records:
        s = ops.setdefault(r["op"], {"dtypes": [], "counts": collections.Counter(), "native": set(),
                                     "fallback": collections.Counter(), "first_failure": None})
        if r["dtype"] not in s["dtypes"]:
            s["dtypes"].append(r["dtype"])
        s["counts"][r["status"]] += 1
        s["native"].update(r.get("native", ()))
        for f in r.get("fallback", ()):
            s["fallback"][f] += 1
        if r["status"] in ("mismatch", "error", "crash") and s["first_failure"] is None:
            s["first_failure"] = f"[{r['dtype']} #{r['sample']} {r['variant']}] {r['msg']}"
    return ops


def totals(records):
    c = collections.Counter(r["status"] for r in records)
    return {s: c.get(s, 0) for s in STATUSES}


def _md_escape(s):
    return s.replace("|", "\\|").replace("\n", " ")


def kernel_column(s):
    if not s["fallback"]:
        return "native" if s["native"] else "-"
    names = [n.replace("aten::", "") for n, _ in s["fallback"].most_common(2)]
    return "fallback (" + ", ".join(names) + (", ..." if len(s["fallback"]) > 2 else "") + ")"


def per_form_lines(records):
    """The status counts per variant and form (`fn`, `out`, `inplace`, each `@form` other than as built)."""
    by = collections.OrderedDict()
    for r in records:
        by.setdefault(r["variant"], collections.Counter())[r["status"]] += 1
    if not by:
        return []
    lines = ["## Per form", "",
             "Variant `fn` is the functional call (with its gradients), `out` the `out=` variant, `inplace` the "
             "in-place one; `@form` names a form other than as built.", "",
             "| variant | " + " | ".join(STATUSES) + " |", "| --- |" + " --- |" * len(STATUSES)]
    def order(v):
        kind, _, form = v.partition("@")
        return (FORMS.index(form) if form in FORMS else 0, kind)
    for v in sorted(by, key=order):
        lines.append(f"| {v} | " + " | ".join(str(by[v][s]) for s in STATUSES) + " |")
    return lines + [""]


def write_markdown(path, records, title_note="", notes=()):
    ops = summarize(records)
    tot = totals(records)
    comparable = tot["pass"] + tot["mismatch"] + tot["error"] + tot["crash"]
    lines = [
        "# OpInfo conformance sweep",
        "",
        "Every OpInfo of PyTorch's `op_db`, every dtype of float32, bfloat16, float16, int64, int32 and bool "
        "that the op supports on CPU, every sample input: run on CPU and on `neuron`, outputs, in-place "
        "arguments, output aliasing and gradients compared. Generated by "
        "`python -m torch_neuronx.tools.opinfo_sweep`" + (f" ({title_note})" if title_note else "") + ".",
        "",
        "| status | samples |",
        "| --- | --- |",
    ]
    for s in STATUSES:
        lines.append(f"| {s} | {tot[s]} |")
    rate = 100.0 * tot["pass"] / comparable if comparable else 100.0
    lines += ["", f"Samples that run on CPU and pass on neuron: {tot['pass']} / {comparable} ({rate:.2f} %). "
              "Column `kernels`: `native` when no sample of the op ran an operator on the CPU fallback, "
              "otherwise the fallback operators it ran most.", ""]
    failing = [(name, s) for name, s in ops.items() if s["first_failure"]]
    if failing:
        lines += ["## Failing ops", ""]
        for name, s in failing:
            c = s["counts"]
            lines.append(f"- `{name}` ({c['mismatch']} mismatch, {c['error']} error, {c['crash']} crash): "
                         f"{_md_escape(s['first_failure'][:200])}")
        lines.append("")
    for note in notes:
        lines += [note, ""]
    lines += per_form_lines(records)
    lines += ["## Per op", "",
              "| op | dtypes | pass | mismatch | error | crash | skipped | kernels | first failure |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in sorted(ops.items()):
        c = s["counts"]
        dt = ",".join(d.replace("float", "f").replace("bfloat", "bf").replace("int", "i") for d in s["dtypes"])
        ff = _md_escape((s["first_failure"] or "")[:120])
        lines.append(f"| {name} | {dt} | {c['pass']} | {c['mismatch']} | {c['error']} | {c['crash']} | "
                     f"{c['skipped']} | {kernel_column(s)} | {ff} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_json(path, records):
    ops = summarize(records)
    doc = {
        "totals": totals(records),
        "ops": {name: {"dtypes": s["dtypes"], "counts": dict(s["counts"]), "native": sorted(s["native"]),
                       "fallback": dict(s["fallback"]), "first_failure": s["first_failure"]}
                for name, s in ops.items()},
        "records": records,
    }
    with open(path, "w") as f:
        json.dump(doc, f)


def read_jsonl(paths):
    records = []
    for p in paths:
        with open(p) as f:
            records += [json.loads(ln) for ln in f if ln.strip()]
    return records


def print_totals(records, out=sys.stdout):
    tot = totals(records)
    print("  ".join(f"{s}={tot[s]}" for s in STATUSES), file=out)


# ---- command line -------------------------------------------------------------------------------------

def select_units(op_db, ops=None, dtypes=None, op_range=None, max_samples=None):
    dtypes = dtypes or list(DTYPES)
    chosen = list(op_db)
    if op_range:
        a, _, b = op_range.partition(":")
        chosen = chosen[int(a or 0):int(b) if b else None]
    if ops:
        wanted = set(ops)
        chosen = [op for op in chosen if op.full_name in wanted or op.name in wanted]
        missing = wanted - {op.full_name for op in chosen} - {op.name for op in chosen}
        if missing:
            raise SystemExit(f"unknown ops: {sorted(missing)}")
    units = []
    for op in chosen:
        for d in op_dtypes(op, dtypes):
            units.append({"op": op.full_name, "dtype": d, "start": 0, "max": max_samples})
    return units


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m torch_neuronx.tools.opinfo_sweep", description=__doc__.split("\n")[0])
    p.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant)")
    p.add_argument("--dtypes", help="comma-separated, from " + ",".join(DTYPES))
    p.add_argument("--op-range", help="START:END slice of op_db (to split a long sweep)")
    p.add_argument("--max-samples-per-op", type=int, default=None, help="per op and dtype")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    p.add_argument("--timeout", type=float, default=SAMPLE_TIMEOUT, help="seconds per sample")
    p.add_argument("--out", default="opinfo_sweep", help="output stem: <out>.jsonl, <out>.json")
    p.add_argument("--md", default=None, help="markdown table (default docs/opinfo_sweep.md for a full sweep)")
    p.add_argument("--note", action="append", default=[], help="a paragraph for the markdown (repeatable)")
    p.add_argument("--report", help="comma-separated .jsonl files: merge them into the markdown (and <out>.json "
                   "with --out), run nothing")
    p.add_argument("--in-process", action="store_true", help="no worker processes (a crash ends the sweep)")
    p.add_argument("--verbose", "-v", action="store_true", help="print every non-passing sample")
    p.add_argument("--forms", default=None, help="comma-separated from " + ",".join(FORMS) + ", or all "
                   "(default: as_built); the out= variant runs with as_built")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.forms:
        os.environ[FORMS_ENV] = a.forms  # workers inherit it
        selected_forms()
    a.out_given = any(x == "--out" or x.startswith("--out=") for x in (argv if argv is not None else sys.argv[1:]))
    if a.worker:
        return worker_main()

    if a.report:
        records = read_jsonl(a.report.split(","))
    else:
        op_db = load_op_db()
        dtypes = a.dtypes.split(",") if a.dtypes else None
        for d in dtypes or ():
            if d not in DTYPES:
                raise SystemExit(f"unknown dtype {d}; choose from {','.join(DTYPES)}")
        units = select_units(op_db, a.ops.split(",") if a.ops else None, dtypes, a.op_range,
                             a.max_samples_per_op)
        print(f"{len(units)} (op, dtype) units", file=sys.stderr)
        jsonl = open(a.out + ".jsonl", "w")
        t0 = time.monotonic()
        seen_ops = set()

        def on_record(rec):
            jsonl.write(json.dumps(rec) + "\n")
            jsonl.flush()
            if rec["op"] not in seen_ops:
                seen_ops.add(rec["op"])
                print(f"[{time.monotonic() - t0:7.1f}s] {rec['op']}", file=sys.stderr, flush=True)
            if a.verbose and rec["status"] in ("mismatch", "error", "crash"):
                print(f"  {rec['status']}: {rec['op']} {rec['dtype']} #{rec['sample']} {rec['variant']}: "
                      f"{rec['msg'][:200]}", file=sys.stderr, flush=True)

        if a.in_process:
            by_name = {op.full_name: op for op in op_db}
            records = []
            for u in units:
                for rec in run_unit(by_name[u["op"]], u["dtype"], 0, u["max"]):
                    records.append(rec)
                    on_record(rec)
        else:
            records = run_isolated(units, jobs=a.jobs, timeout=a.timeout, on_record=on_record)
        jsonl.close()
        print(f"{len(records)} samples in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    if not a.report or a.out_given:
        # A merge writes the combined records only where asked, so the working directory is left alone.
        write_json(a.out + ".json", records)
    md = a.md or (os.path.join("docs", "opinfo_sweep.md") if not (a.ops or a.op_range) else None)
    if md:
        write_markdown(md, records, notes=a.note)
        print(f"wrote {md}", file=sys.stderr)
    print_totals(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
