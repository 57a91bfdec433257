"""Module conformance sweep: every entry of PyTorch's `module_db` (torch.testing._internal.common_modules),
run on CPU and on neuron.

For each non-lazy module, each dtype (float32, and bfloat16 where CPU supports it), training and eval mode,
and each of its module inputs (up to --max-inputs): the module is built on CPU, copied to neuron, and the
forward runs on both, as built and with 4-D/5-D inputs (and the module) in channels-last. Outputs, the
input gradients and every parameter's gradient are compared. Statuses as in opinfo_sweep: pass, mismatch,
error (raises on neuron only), skipped (fails on CPU, random, or nothing to compare).

    python -m torch_neuronx.tools.module_sweep                      # everything, docs/module_sweep.md
    python -m torch_neuronx.tools.module_sweep --modules nn.Conv2d,nn.LSTM --max-inputs 2
"""

import argparse
import collections
import copy
import sys
import time
import warnings

import torch_neuronx  # noqa: F401  (registers the device before torch.testing._internal loads)
import torch
from torch.utils._pytree import tree_map

from .opinfo_sweep import Mismatch, _channels_last, compare, first_line, tensor_leaves

FORMS = ("as_built", "channels_last")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_module_db():
    from torch.testing._internal.common_modules import module_db

    return [m for m in module_db if not m.is_lazy]


def _relayout(x, form):
    """x as a fresh leaf (module inputs may be views of one graph; each position gets its own), in form."""
    if not isinstance(x, torch.Tensor):
        return x
    y = (_channels_last(x.detach()) if form == "channels_last" else None)
    if y is None:
        y = x.detach().clone()
    return y.requires_grad_(x.requires_grad) if (y.is_floating_point() or y.is_complex()) else y


def _to_device(x, device):
    """x on device with x's strides (inputs are fresh dense clones: empty_like keeps their layout)."""
    if isinstance(x, torch.Tensor):
        y = torch.empty_like(x, device=device).copy_(x.detach())
        return y.requires_grad_(x.requires_grad)
    return x


def _run(module, args, kwargs, seed):
    torch.manual_seed(seed)
    out = module(*args, **kwargs)
    return out


def _backward(out, inputs, params, seed):
    """Gradients of sum(out_i * g_i) for fixed pseudo-random g_i; None where a tensor gets none."""
    outs = [o for o in tensor_leaves([out]) if o.requires_grad and (o.is_floating_point() or o.is_complex())]
    if not outs:
        return None
    gen = torch.Generator().manual_seed(seed)
    total = sum((o * torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype).to(o.device)).sum()
                for o in outs)
    wrt = [t for t in inputs + params if t.requires_grad]
    grads = torch.autograd.grad(total, wrt, allow_unused=True)
    return [g for g in grads]


def run_case(info, dtype, training, form, mi, seed):
    """(status, message) of one module input in one form."""
    # fp32: gradients through several reductions differ from CPU's summation order by more than
    # assert_close's 1.3e-6 (MultiheadAttention's in_proj_weight by 2.5e-5); bf16: a rounding per op.
    tol = (5e-5, 1e-4) if dtype == torch.float32 else (4e-2, 4e-2)
    ctor, fwd = mi.constructor_input, mi.forward_input
    try:
        torch.manual_seed(seed)
        m_cpu = info.module_cls(*ctor.args, **ctor.kwargs).to(dtype)
        m_cpu.train(training)
    except Exception as e:  # noqa: BLE001
        return "skipped", "construction fails on CPU: " + first_line(e)
    args = tree_map(lambda x: _relayout(x, form), fwd.args)
    kwargs = tree_map(lambda x: _relayout(x, form), fwd.kwargs)
    if form == "channels_last":
        if not any(t.dim() in (4, 5) for t in tensor_leaves([list(args), kwargs])):
            return None  # nothing to relayout
        try:
            m_cpu = m_cpu.to(memory_format=torch.channels_last if any(
                t.dim() == 4 for t in tensor_leaves([list(args), kwargs])) else torch.channels_last_3d)
        except Exception:  # noqa: BLE001  (weights of other ranks)
            pass
    m_dev = copy.deepcopy(m_cpu).to("neuron")
    dev_args = tree_map(lambda x: _to_device(x, "neuron"), args)
    dev_kwargs = tree_map(lambda x: _to_device(x, "neuron"), kwargs)
    cpu_inputs = [t for t in tensor_leaves([list(args), kwargs])]
    dev_inputs = [t for t in tensor_leaves([list(dev_args), dev_kwargs])]
    try:
        expected = _run(m_cpu, args, kwargs, seed)
        cpu_grads = _backward(expected, cpu_inputs, list(m_cpu.parameters()), seed)
    except Exception as e:  # noqa: BLE001
        return "skipped", "fails on CPU: " + first_line(e)
    try:  # random in training (dropout, RReLU): the same call must repeat on CPU
        again = _run(copy.deepcopy(m_cpu), tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, args),
                     kwargs, seed + 1)
        compare(again, expected, *tol, device="cpu")
    except Mismatch:
        return "skipped", "random on CPU"
    except Exception:  # noqa: BLE001
        pass
    stage = "forward"
    try:
        actual = _run(m_dev, dev_args, dev_kwargs, seed)
        stage = "backward"
        dev_grads = _backward(actual, dev_inputs, list(m_dev.parameters()), seed) if cpu_grads is not None else None
    except Exception as e:  # noqa: BLE001
        return "error", f"{stage}: " + first_line(e)
    try:
        compare(actual, expected, *tol)
        if cpu_grads is not None:
            names = ([f"input {i}" for i, t in enumerate(cpu_inputs) if t.requires_grad]
                     + [f"parameter {n}" for n, p in m_cpu.named_parameters() if p.requires_grad])
            for name, g_dev, g_cpu in zip(names, dev_grads, cpu_grads):
                if (g_dev is None) != (g_cpu is None):
                    raise Mismatch(f"{name}: gradient {'missing' if g_dev is None else 'unexpected'} on neuron")
                if g_cpu is not None:
                    compare(g_dev, g_cpu, *tol, path=f"gradient of {name}")
    except Mismatch as e:
        return "mismatch", str(e)[:400]
    return "pass", ""


def run_module(info, dtypes=("float32", "bfloat16"), max_inputs=None):
    """Yields one record per (dtype, mode, input, form)."""
    for dname in dtypes:
        dtype = DTYPES[dname]
        if dtype not in info.supported_dtypes("cpu"):
            continue
        for training in (True, False):
            mode = "train" if training else "eval"
            try:
                inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True,
                                                 training=training)
            except Exception as e:  # noqa: BLE001
                yield dict(module=info.name, dtype=dname, mode=mode, input=-1, form="as_built", status="skipped",
                           msg="inputs fail on CPU: " + first_line(e))
                continue
            for k, mi in enumerate(inputs[:max_inputs] if max_inputs else inputs):
                for form in FORMS:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        try:
                            res = run_case(info, dtype, training, form, mi, 1000 + k)
                        except Exception as e:  # noqa: BLE001  (a bug of this tool, reported)
                            res = ("error", "sweep: " + first_line(e))
                    if res is None:
                        continue
                    yield dict(module=info.name, dtype=dname, mode=mode, input=k, form=form, status=res[0],
                               msg=res[1])


def write_markdown(path, records, notes=()):
    by = collections.OrderedDict()
    for r in records:
        by.setdefault(r["module"], collections.Counter())[r["status"]] += 1
    tot = collections.Counter(r["status"] for r in records)
    forms = collections.defaultdict(collections.Counter)
    for r in records:
        forms[r["form"]][r["status"]] += 1
    lines = ["# Module conformance sweep", "",
             "Every non-lazy entry of PyTorch's `module_db`: forward and backward (input and parameter gradients) "
             "on CPU and on `neuron`, float32 and bfloat16 where CPU supports it, training and eval mode, each "
             "module input as built and in channels-last. Generated by `python -m torch_neuronx.tools.module_sweep`.",
             "", "| form | pass | mismatch | error | skipped |", "| --- | --- | --- | --- | --- |"]
    for f, c in forms.items():
        lines.append(f"| {f} | {c['pass']} | {c['mismatch']} | {c['error']} | {c['skipped']} |")
    lines.append(f"| all | {tot['pass']} | {tot['mismatch']} | {tot['error']} | {tot['skipped']} |")
    lines += ["", *notes, "", "## Failing", ""]
    for r in records:
        if r["status"] in ("mismatch", "error"):
            lines.append(f"- `{r['module']}` {r['dtype']} {r['mode']} input {r['input']} {r['form']}: "
                         f"{r['status']}: {r['msg'][:300]}".replace("|", "\\|"))
    lines += ["", "## Per module", "", "| module | pass | mismatch | error | skipped |", "| --- | --- | --- | --- | --- |"]
    for name, c in by.items():
        lines.append(f"| `{name}` | {c['pass']} | {c['mismatch']} | {c['error']} | {c['skipped']} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m torch_neuronx.tools.module_sweep", description=__doc__.split("\n")[0])
    p.add_argument("--modules", help="comma-separated module_db names (e.g. nn.Conv2d)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--max-inputs", type=int, default=6)
    p.add_argument("--md", default=None, help="markdown report (e.g. docs/module_sweep.md)")
    p.add_argument("--note", action="append", default=[])
    a = p.parse_args(argv)
    infos = load_module_db()
    if a.modules:
        wanted = set(a.modules.split(","))
        infos = [m for m in infos if m.name in wanted]
    t0 = time.monotonic()
    records = []
    for info in infos:
        for r in run_module(info, a.dtypes.split(","), a.max_inputs):
            records.append(r)
            if r["status"] in ("mismatch", "error"):
                print(f"  {r['status']}: {r['module']} {r['dtype']} {r['mode']} #{r['input']} {r['form']}: "
                      f"{r['msg'][:200]}", file=sys.stderr, flush=True)
        print(f"[{time.monotonic() - t0:7.1f}s] {info.name}", file=sys.stderr, flush=True)
    tot = collections.Counter(r["status"] for r in records)
    print(" ".join(f"{s}={tot[s]}" for s in ("pass", "mismatch", "error", "skipped")))
    if a.md:
        write_markdown(a.md, records, a.note)
    return 0 if not (tot["mismatch"] or tot["error"]) else 1


if __name__ == "__main__":
    sys.exit(main())
