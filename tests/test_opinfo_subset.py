"""A fixed subset of the OpInfo conformance sweep (torch_neuronx.tools.opinfo_sweep) for CI: the operators
that LLM and diffusion models use, every dtype of the sweep the op supports on CPU, the first samples of
each. Every sample that runs on CPU must give the same result on neuron (outputs, in-place arguments,
aliasing, gradients).

In process by default (fast); TORCH_NEURONX_SWEEP_ISOLATE=1 runs the subset in worker processes, so a
crash is reported as one failing sample instead of ending the test session."""

import os
import sys

import pytest
import torch

pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest (in requirements.txt)")

from torch_neuronx.tools import opinfo_sweep as sweep  # noqa: E402

OPS = [
    "add", "mul", "sub", "div.no_rounding_mode", "div.floor_rounding", "matmul", "mm", "bmm", "addmm",
    "nn.functional.linear", "softmax", "log_softmax", "nn.functional.silu", "nn.functional.gelu",
    "nn.functional.relu", "nn.functional.layer_norm", "nn.functional.rms_norm", "nn.functional.group_norm",
    "nn.functional.embedding", "nn.functional.cross_entropy", "nn.functional.nll_loss", "sum", "mean",
    "amax", "max.reduction_with_dim", "max.reduction_no_dim", "argmax", "var", "std", "cumsum", "logsumexp",
    "where", "masked_fill", "clamp", "pow", "exp", "log", "rsqrt", "sqrt", "sin", "cos", "tanh", "sigmoid",
    "cat", "index_select", "gather", "scatter", "scatter_add", "index_put", "index_copy", "index_add", "topk",
    "sort", "nonzero", "triu", "tril", "arange", "nn.functional.scaled_dot_product_attention",
    "nn.functional.conv2d", "nn.functional.interpolate.nearest", "nn.functional.interpolate.bilinear", "to",
    "contiguous", "clone", "transpose", "reshape", "expand",
]
MAX_SAMPLES = 6  # per op and dtype: keeps the subset within CI's budget
FAILING = ("mismatch", "error", "crash")


@pytest.fixture(scope="module")
def ops():
    return {op.full_name: op for op in sweep.load_op_db()}


@pytest.fixture(scope="module")
def isolated_records(ops):
    if os.environ.get("TORCH_NEURONX_SWEEP_ISOLATE", "0") in ("", "0"):
        return None
    units = sweep.select_units(list(ops.values()), OPS, max_samples=MAX_SAMPLES)
    by_op = {}
    for rec in sweep.run_isolated(units):
        by_op.setdefault(rec["op"], []).append(rec)
    return by_op




@pytest.mark.parametrize("name", OPS)
def test_opinfo_matches_cpu(name, ops, isolated_records):
    op = ops[name]
    if isolated_records is not None:
        records = isolated_records.get(name, [])
    else:
        records = [rec for d in sweep.op_dtypes(op, list(sweep.DTYPES))
                   for rec in sweep.run_unit(op, d, max_samples=MAX_SAMPLES)]
    assert records, f"{name}: no samples ran"
    bad = [f"{r['dtype']} sample {r['sample']} ({r['variant']}): {r['status']}: {r['msg']}"
           for r in records if r["status"] in FAILING]
    assert not bad, f"{name}: {len(bad)} of {len(records)} samples differ from CPU:\n" + "\n".join(bad[:10])
    # The subset is chosen so that every op has samples that actually compare.
    assert any(r["status"] == "pass" for r in records), f"{name}: nothing compared: {records[0]['msg']}"


# ---- the sweep's own machinery ----------------------------------------------------------------------

def test_compare_detects_differences():
    a = torch.arange(6.0).reshape(2, 3)
    n = a.to("neuron")
    sweep.compare(n, a, 1e-5, 1e-6)
    sweep.compare([n, 2.0, (torch.Size([2]), "x")], [a, 2.0, (torch.Size([2]), "x")], 0, 0)
    with pytest.raises(sweep.Mismatch, match="not close"):
        sweep.compare(n + 1e-3, a, 1e-5, 1e-6)
    with pytest.raises(sweep.Mismatch, match="expected a neuron tensor"):
        sweep.compare(a.clone(), a, 1e-5, 1e-6)
    with pytest.raises(sweep.Mismatch, match="dtype"):
        sweep.compare(n.double(), a, 1e-5, 1e-6)
    with pytest.raises(sweep.Mismatch):
        sweep.compare((n,), (a, a), 0, 0)
    nan = torch.tensor([float("nan"), 1.0])
    sweep.compare(nan.to("neuron"), nan, 0, 0)


def test_mover_keeps_layout_and_sharing():
    base = torch.arange(24.0).reshape(4, 6)
    t, view = base.t()[1:, ::2], base[1]
    expanded = torch.arange(3.0).expand(4, 3)
    m = sweep.Mover("neuron")
    nt, nv, ne = m([t, view, expanded])
    for c, d in ((t, nt), (view, nv), (expanded, ne)):
        assert d.device.type == "neuron"
        assert (d.shape, d.stride(), d.storage_offset()) == (c.shape, c.stride(), c.storage_offset())
        assert torch.equal(d.cpu(), c)
    assert nt.untyped_storage().data_ptr() == nv.untyped_storage().data_ptr()
    assert m({"device": "cpu", "x": torch.device("cpu")}) == {"device": "neuron", "x": torch.device("neuron")}


def test_alias_sets():
    x = torch.randn(4, 4)
    y = torch.randn(4)
    assert sweep.alias_sets([x.t(), x + 1, y[1:]], [x, y]) == [frozenset({0}), frozenset(), frozenset({1})]


@pytest.mark.parametrize("kind", ["abort", "hang"])
def test_isolation_records_crash_and_continues(kind, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_SWEEP_FAULT", f"add/int64/1/{kind}")
    units = [{"op": "add", "dtype": "int64", "start": 0, "max": 2},
             {"op": "mul", "dtype": "int64", "start": 0, "max": 1}]
    records = sweep.run_isolated(units, timeout=10 if kind == "hang" else 60)
    got = [(r["op"], r["case"], r["status"]) for r in records]
    assert got[0] == ("add", 0, "pass")
    assert got[1] == ("add", 1, "crash")
    assert ("SIGABRT" if kind == "abort" else "timeout") in records[1]["msg"]
    # The sweep went on: the rest of the unit in a new worker, then the next unit.
    assert [g for g in got[2:] if g[2] != "pass"] == []
    assert {g[0] for g in got[2:]} == {"add", "mul"}


# ---- every form: the samples above in other layouts and through out= ----------------------------------

# Per native kernel family (one csrc/aten/neuron_ops_<family>.cpp each), ops whose samples reach its kernels.
FORM_OPS = {
    "pointwise": ["add", "mul", "div.no_rounding_mode", "nn.functional.gelu", "nn.functional.silu", "where", "clamp",
                  "pow", "exp"],
    "reduce": ["sum", "mean", "amax", "argmax", "softmax", "log_softmax", "nn.functional.layer_norm",
               "nn.functional.rms_norm", "nn.functional.nll_loss", "var", "cumsum", "logsumexp"],
    "linalg": ["mm", "bmm", "addmm", "matmul", "nn.functional.linear"],
    "index": ["index_select", "gather", "scatter", "scatter_add", "index_add", "index_copy", "cat",
              "nn.functional.embedding"],
    "select": ["sort", "topk", "nonzero", "masked_fill"],
    "attention": ["nn.functional.scaled_dot_product_attention"],
    "conv": ["nn.functional.conv2d", "nn.functional.conv1d", "nn.functional.conv_transpose2d"],
    "histc": ["histc"],
}
FORM_SAMPLES = 3


@pytest.mark.parametrize("form", [f for f in sweep.FORMS if f != "as_built"] + ["out"])
@pytest.mark.parametrize("family", list(FORM_OPS))
def test_opinfo_forms_match_cpu(family, form, ops, monkeypatch):
    """Each sample in `form` (noncontiguous, channels-last, stride-0 expanded input; `out`: the out= variant
    of the sample as built) gives on neuron what it gives on CPU."""
    monkeypatch.setenv(sweep.FORMS_ENV, "as_built" if form == "out" else form)
    want = "out" if form == "out" else f"@{form}"
    cases, ran, bad = 0, 0, []
    # channels-last needs 4-D/5-D samples, which most ops build only after their first few.
    samples = 12 if form == "channels_last" else FORM_SAMPLES
    for name in FORM_OPS[family]:
        op = ops[name]
        for d in sweep.op_dtypes(op, ["float32", "bfloat16", "int64"]):
            for r in sweep.run_unit(op, d, max_samples=samples):
                if want not in r["variant"]:
                    continue
                cases += 1
                ran += r["status"] == "pass"
                if r["status"] in FAILING:
                    bad.append(f"{name} {d} sample {r['sample']} ({r['variant']}): {r['status']}: {r['msg']}")
    assert not bad, f"{family}/{form}: {len(bad)} samples differ from CPU:\n" + "\n".join(bad[:10])
    if cases == 0:  # e.g. no out= variant (attention, conv), no 4-D sample, only 1-element inputs
        pytest.skip(f"no sample of {family} has a {form} form")
    assert ran > 0, f"{family}/{form}: none of {cases} samples compared"


def test_gradient_arbiter_accepts_only_no_worse_than_cpu():
    # x**y summed over a broadcast dim: float32 CPU gradient vs the float64 one differ by rounding; a device
    # gradient equal to CPU's, or nearer to float64, passes; one further off than CPU's plus the tolerance fails.
    x = torch.rand(10, 1, 5, dtype=torch.float32) + 0.5
    y = (torch.rand(1, 10, 5, dtype=torch.float32) * 4).requires_grad_()
    args = (x, (y,), {})
    fn = torch.pow
    out = fn(x, y)
    g = torch.Generator().manual_seed(3)
    go = torch.randn(out.shape, generator=g, dtype=out.dtype)
    cpu = list(torch.autograd.grad(out, [y], go))
    ok = sweep._as_close_as_cpu(fn, args, lambda t: t, [y], 3, [cpu[0].clone()], cpu, 1e-5, 1.3e-6)
    assert ok
    worse = cpu[0].clone()
    worse[0, 0, 0] += 1e-2 * (1 + worse[0, 0, 0].abs())
    assert not sweep._as_close_as_cpu(fn, args, lambda t: t, [y], 3, [worse], cpu, 1e-5, 1.3e-6)


def _layout_dependent(cpu_wrong, neuron_wrong):
    """sum over dim 0, made wrong on CPU for a stride-0 input (as masked.median's CPU kernel is) and/or on
    neuron."""
    def fn(x):
        r = x.sum(0)
        if cpu_wrong and x.device.type == "cpu" and x.stride(0) == 0:
            r = r + 100
        if neuron_wrong and x.device.type == "neuron":
            r = r + 1
        return r
    return fn


@pytest.mark.parametrize("cpu_wrong,neuron_wrong,form,want", [
    (True, False, "expanded", "skipped"),      # CPU differs from itself on contiguous values: not a CPU pass
    (True, True, "expanded", "mismatch"),      # ... but neuron must still match the contiguous CPU result
    (False, True, "expanded", "mismatch"),     # CPU consistent: a wrong neuron result fails
    (False, True, "noncontiguous", "mismatch"),
    (False, False, "expanded", "pass"),
])
def test_forms_sweep_skips_only_cpu_inconsistent_samples(cpu_wrong, neuron_wrong, form, want):
    from types import SimpleNamespace

    from torch.testing._internal.opinfo.core import SampleInput

    op = SimpleNamespace(op=_layout_dependent(cpu_wrong, neuron_wrong), inplace_variant=None, name="layout_dep")
    x = torch.randn(4, 5, requires_grad=True)
    sample = sweep.form_of(SampleInput(x), form)
    status, msg = sweep.run_case(op, torch.float32, sample, "fn@" + form, 7, (1e-5, 1.3e-6), {})
    assert status == want, msg
    if want == "skipped":
        assert "inconsistent on CPU" in msg and "contiguous" in msg
    if cpu_wrong and want == "mismatch":
        assert "neuron matches neither" in msg


def test_masked_median_of_stride0_input_is_not_a_failure(ops, monkeypatch):
    # PyTorch's CPU masked.median of an expanded input returns an uninitialised value: CPU-inconsistent (or,
    # when two CPU runs read different garbage, nondeterministic), so skipped, or a pass should the garbage
    # happen to be right; never a mismatch.
    monkeypatch.setenv(sweep.FORMS_ENV, "expanded")
    records = list(sweep.run_unit(ops["masked.median"], "float32", max_samples=3))
    assert records
    bad = [r for r in records if r["status"] in FAILING]
    assert not bad, [(r["variant"], r["status"], r["msg"]) for r in bad]
    for r in records:
        assert r["status"] == "pass" or r["msg"].startswith(("inconsistent on CPU", "nondeterministic on CPU")), r


def test_gradient_arbiter_no_reference_where_cpu_has_no_correct_digit():
    # y * ((y + 1e8) - 1e8 - y): its float32 gradient is rounding noise (up to ~4), the float64 one ~0; CPU's
    # value is then no reference and a device value differing from it is no failure. Where float32 is exact
    # (y = 0, 8: 1e8 + 8 is a float32), a device value off by as much still fails.
    y = torch.tensor([0.3, 1.7, 2.9], requires_grad=True)
    args = (y, (), {})

    def fn(t):
        return t * (((t + 1e8) - 1e8) - t)

    g = torch.Generator().manual_seed(3)
    out = fn(y)
    go = torch.randn(out.shape, generator=g, dtype=out.dtype)
    cpu = list(torch.autograd.grad(out, [y], go))
    assert float(cpu[0].abs().min()) > 0.1  # float32 noise, the exact gradient ~1e-8
    other = [cpu[0] + 3.0]
    assert sweep._as_close_as_cpu(fn, args, lambda t: t, [y], 3, other, cpu, 1e-5, 1.3e-6) == sweep.CPU_GRAD_WRONG
    y2 = torch.tensor([0.3, 0.0, 8.0], requires_grad=True)
    out2 = fn(y2)
    cpu2 = list(torch.autograd.grad(out2, [y2], go))
    assert cpu2[0][1] == 0 and cpu2[0][2] == 0
    assert not sweep._as_close_as_cpu(fn, (y2, (), {}), lambda t: t, [y2], 3, [cpu2[0] + 3.0], cpu2, 1e-5, 1.3e-6)


@pytest.mark.parametrize("form", ["as_built", "expanded"])
def test_qr_based_gradients_of_tiny_products(form, ops, monkeypatch):
    # householder_product's and ormqr's float32 backward decide their last bits in 5x5 products, which a
    # rank-deficient (stride-0) input amplifies past the tolerance: on AMD CPUs PyTorch's small products
    # round each term while the native GEMM fused them. Tiny products now run CPU's GEMM (neuron_ops_linalg).
    monkeypatch.setenv(sweep.FORMS_ENV, form)
    bad, ran = [], 0
    for name in ("linalg.householder_product", "ormqr"):
        for r in sweep.run_unit(ops[name], "float32", max_samples=8):
            ran += r["status"] == "pass"
            if r["status"] in FAILING:
                bad.append(f"{name} sample {r['sample']} ({r['variant']}): {r['msg'][:200]}")
    assert not bad, "\n".join(bad)
    assert ran > 0
