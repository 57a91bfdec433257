"""torch.profiler on neuron: device kernels (native, fallback, collective, compiled graph and the kernels
Inductor generated for it) in the key_averages() table and in the exported Chrome trace
(csrc/aten/neuron_profiler.cpp)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torch_neuronx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _fallback_op_name():
    """An operator that runs through the CPU fallback today (kthvalue has no native kernel)."""
    x = torch.randn(8, 8, device="neuron")
    before = torch_neuronx.op_counts().get("aten::kthvalue.values", {}).get("fallback", 0)
    torch.kthvalue(x, 3, 1)
    after = torch_neuronx.op_counts().get("aten::kthvalue.values", {}).get("fallback", 0)
    assert after == before + 1, "kthvalue no longer falls back: pick another fallback op for this test"
    return "aten::kthvalue"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    fallback = _fallback_op_name()
    a = torch.randn(48, 32, device="neuron")
    b = torch.randn(32, 40, device="neuron")
    f = torch.compile(lambda t: torch.relu(t @ t.T) * 2 + 1, backend="neuron")
    f(a)  # compile outside the profiled region
    with profile(activities=ACTIVITIES, record_shapes=True) as prof:
        c = a @ b
        d = c + 1
        torch.kthvalue(a, 3, 1)
        f(a)
        torch.neuron.synchronize()
    assert d.shape == (48, 40)
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    prof.export_chrome_trace(str(path))
    with open(path) as fh:
        trace = json.load(fh)
    return prof, trace["traceEvents"], fallback


def _kernels(events):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


def _export(prof, path):
    prof.export_chrome_trace(str(path))
    with open(path) as fh:
        return json.load(fh)["traceEvents"]


def _inside(g, kernels):
    """The kernels on the device row and thread of range ``g``, within its span."""
    return [e for e in kernels if e is not g and e["pid"] == g["pid"] and e["tid"] == g["tid"]
            and g["ts"] <= e["ts"] and e["ts"] + e["dur"] <= g["ts"] + g["dur"] + 1e-3]


def _process_names(events):
    return {e["pid"]: e["args"].get("name") for e in events if e.get("ph") == "M" and e["name"] == "process_name"}


def test_table_has_device_time_column_and_kernels(run):
    prof, _, fallback = run
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=40)
    assert "Self NEURON" in table and "NEURON total" in table
    for name in ("[neuron] aten::mm", "[neuron] aten::add", f"[neuron fallback] {fallback}", "[neuron graph] graph"):
        assert name in table, (name, table)
    avgs = {e.key: e for e in prof.key_averages()}
    # The device time of a kernel is added to the operator it runs in.
    assert avgs["aten::mm"].device_time_total > 0
    assert avgs["[neuron] aten::mm"].self_device_time_total > 0
    assert avgs["aten::mm"].cpu_time_total > 0


def test_chrome_trace_kernels_have_shapes_dtypes_bytes(run):
    _, events, fallback = run
    kernels = _kernels(events)
    by_name = {}
    for e in kernels:
        by_name.setdefault(e["name"], []).append(e)
    mm = by_name["[neuron] aten::mm"][0]
    assert mm["dur"] > 0
    assert mm["args"]["Input Dims"][:2] == [[48, 32], [32, 40]]
    assert mm["args"]["Input type"][:2] == ["Float", "Float"]
    assert mm["args"]["bytes"] == 4 * (48 * 32 + 32 * 40 + 48 * 40)
    assert mm["args"]["kind"] == "native"
    add = [e for n, es in by_name.items() if n.startswith("[neuron] aten::add") for e in es]
    assert add and add[0]["args"]["Input Dims"][0] == [48, 40] and add[0]["dur"] > 0
    fb = by_name[f"[neuron fallback] {fallback}"][0]
    assert fb["args"]["kind"] == "fallback" and fb["dur"] > 0 and fb["args"]["Input Dims"][0] == [48, 32]
    # Device rows are labelled as the neuron device they show.
    assert mm["pid"] == 0 and mm["args"]["device"] == 0
    assert _process_names(events)[0] == "neuron:0"


def test_compiled_graph_is_one_event_holding_its_kernels(run):
    _, events, _ = run
    kernels = _kernels(events)
    graphs = [e for e in kernels if e["name"].startswith("[neuron graph]")]
    assert len(graphs) == 1 and graphs[0]["args"]["kind"] == "compiled graph"
    g = graphs[0]
    inside = _inside(g, kernels)
    # The graph's extern GEMM (t @ t.T) runs as a native kernel inside the graph's range.
    assert any(e["name"].startswith("[neuron] aten::mm") for e in inside), [e["name"] for e in inside]


def test_generated_kernels_carry_their_name_shapes_and_bytes(run):
    prof, events, _ = run
    kernels = _kernels(events)
    g = next(e for e in kernels if e["name"].startswith("[neuron graph]"))
    # relu(t @ t.T) * 2 + 1: the element-wise tail is one C++ kernel Inductor generated, run in place on the
    # GEMM's 48x48 result; its name says what it computes.
    gen = [e for e in _inside(g, kernels) if e["args"]["kind"] == "generated"]
    assert len(gen) == 1, [e["name"] for e in _inside(g, kernels)]
    k = gen[0]
    assert k["name"].startswith("[neuron] cpp_fused_") and "relu" in k["name"], k["name"]
    assert k["args"]["Input Dims"] == [[48, 48]] and k["args"]["Input type"] == ["Float"]
    assert k["args"]["bytes"] == 48 * 48 * 4 and k["args"]["device"] == 0 and k["dur"] > 0
    # On the host row a range of the same name, which the kernel's device time is added to.
    host = k["name"][len("[neuron] "):]
    avgs = {e.key: e for e in prof.key_averages()}
    assert avgs[host].device_time_total > 0 and avgs[host].count == 1
    assert avgs[k["name"]].self_device_time_total > 0


def test_backward_graph_is_one_event_holding_its_kernels(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).to("neuron")
    x = torch.randn(8, 32, device="neuron")
    step = torch.compile(lambda t: model(t).square().mean(), backend="neuron")
    step(x).backward()  # compile both graphs outside the profiled region
    model.zero_grad()
    with profile(activities=ACTIVITIES, record_shapes=True) as prof:
        step(x).backward()
        torch.neuron.synchronize()
    kernels = _kernels(_export(prof, tmp_path / "trace.json"))
    graphs = [e for e in kernels if e["name"].startswith("[neuron graph]")]
    forward = [e for e in graphs if " backward of " not in e["name"]]
    backward = [e for e in graphs if " backward of " in e["name"]]
    assert len(forward) == 1 and len(backward) == 1, [e["name"] for e in graphs]
    bw = backward[0]
    assert bw["args"]["kind"] == "compiled graph" and bw["ts"] >= forward[0]["ts"] + forward[0]["dur"]
    inside = _inside(bw, kernels)
    names = [e["name"] for e in inside]
    # The weight gradients are extern GEMMs (native kernels); relu's gradient is a generated kernel.
    assert sum(n.startswith("[neuron] aten::mm") for n in names) >= 2, names
    assert any(e["args"]["kind"] == "generated" and "threshold_backward" in e["name"] for e in inside), names
    # The graphs' kernels are all inside their ranges; outside them only the engine's seed gradient
    # (ones_like of the loss: an allocation and a fill) runs.
    outside = [e["name"] for e in kernels if e not in graphs and not any(e in _inside(g, kernels) for g in graphs)]
    assert not [n for n in outside if "aten::mm" in n or "cpp_fused" in n], outside
    avgs = {e.key: e for e in prof.key_averages()}
    host = bw["name"][len("[neuron graph] "):]
    assert avgs[host].count == 1 and avgs[host].device_time_total > 0


def test_backward_alone_under_the_profiler_is_one_event(tmp_path):
    # The forward ran before the profiler started: the backward is still one event holding its kernels.
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to("neuron")
    x = torch.randn(5, 16, device="neuron")
    step = torch.compile(lambda t: model(t).square().sum(), backend="neuron")
    step(x).backward()
    loss = step(x)
    with profile(activities=ACTIVITIES) as prof:
        loss.backward()
        torch.neuron.synchronize()
    kernels = _kernels(_export(prof, tmp_path / "trace.json"))
    graphs = [e for e in kernels if e["name"].startswith("[neuron graph]")]
    assert len(graphs) == 1 and " backward of " in graphs[0]["name"], [e["name"] for e in graphs]
    inside = [e["name"] for e in _inside(graphs[0], kernels)]
    assert any(n.startswith("[neuron] aten::mm") for n in inside), inside


@pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs two neuron cores")
def test_events_carry_the_device_they_ran_on(tmp_path):
    a = torch.randn(24, 16, device="neuron:1")
    f = torch.compile(lambda t: torch.relu(t @ t.T) + 1, backend="neuron")
    f(a)
    b = torch.randn(16, 16, device="neuron:0")
    with profile(activities=ACTIVITIES, record_shapes=True) as prof:
        a @ a.T
        b @ b
        torch.ones(4, device="neuron:1")
        f(a)
        torch.neuron.synchronize()
    events = _export(prof, tmp_path / "trace.json")
    kernels = _kernels(events)
    mm = [e for e in kernels if e["name"].startswith("[neuron] aten::mm")]
    by_shape = {tuple(e["args"]["Input Dims"][0]): e for e in mm}
    assert by_shape[(24, 16)]["pid"] == 1 and by_shape[(24, 16)]["args"]["device"] == 1
    assert by_shape[(16, 16)]["pid"] == 0 and by_shape[(16, 16)]["args"]["device"] == 0
    # A factory op has no neuron input: it ran where its result is.
    fill = [e for e in kernels if e["args"].get("Input Dims", [None])[0] == [4] or "fill" in e["name"]]
    assert fill and all(e["pid"] == 1 for e in fill), [(e["name"], e["pid"]) for e in fill]
    g = next(e for e in kernels if e["name"].startswith("[neuron graph]"))
    assert g["pid"] == 1 and g["args"]["device"] == 1
    inside = _inside(g, kernels)
    assert {e["args"]["kind"] for e in inside} == {"native", "generated"}, [e["name"] for e in inside]
    names = _process_names(events)
    assert names[0] == "neuron:0" and names[1] == "neuron:1"
    # PyTorch's own view of the events agrees (FunctionEvent.device_index).
    devs = {e.name: e.device_index for e in prof.events() if e.name.startswith("[neuron graph]")}
    assert list(devs.values()) == [1], devs


def test_no_events_without_privateuse1_activity():
    a = torch.randn(16, 16, device="neuron")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        a @ a
    assert not any(e.key.startswith("[neuron") for e in prof.key_averages())
    assert not torch_neuronx._C._prof_active()


def test_collectives_have_sizes(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent("""
        import json, os, sys, torch, torch.distributed as dist
        from torch.profiler import ProfilerActivity, profile
        rank = int(os.environ["RANK"])
        dist.init_process_group("neuron")
        t = torch.ones(1000, device=f"neuron:{os.environ['LOCAL_RANK']}")
        gathered = torch.empty(2000, device=t.device)
        scattered = torch.empty(500, device=t.device)
        dist.all_reduce(t)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], record_shapes=True) as p:
            dist.all_reduce(t)
            dist.all_gather_into_tensor(gathered, t)
            dist.reduce_scatter_tensor(scattered, t)
            dist.broadcast(t, src=0)
            torch.neuron.synchronize()
        assert t[0].item() == 4.0 and gathered[1999].item() == 4.0 and scattered[0].item() == 8.0
        p.export_chrome_trace(sys.argv[1] + f".{rank}.json")
        dist.destroy_process_group()
    """))
    out = str(tmp_path / "trace")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(worker), out]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Bytes a collective moves on its rank: what it reads from its buffers plus what it writes to them
    # (S = the full tensor, n = 2 ranks): all_reduce reads S and writes S; all_gather reads S/n and writes S;
    # reduce_scatter reads S and writes S/n; broadcast's root reads S, the others write S.
    expected = {"all_reduce": (4000, 4000), "all_gather_into_tensor": (4000, 8000),
                "reduce_scatter_tensor": (4000, 2000)}
    for rank in range(2):
        with open(f"{out}.{rank}.json") as fh:
            kernels = _kernels(json.load(fh)["traceEvents"])
        coll = {e["name"][len("[neuron collective] "):]: e for e in kernels
                if e["name"].startswith("[neuron collective]")}
        assert set(coll) == {*expected, "broadcast"}, [e["name"] for e in kernels]
        for name, e in coll.items():
            assert e["args"]["kind"] == "collective" and e["dur"] > 0 and e["args"]["device"] == rank
            assert e["pid"] == rank
            read, written = expected.get(name, (4000, 0) if rank == 0 else (0, 4000))
            assert (e["args"]["bytes read"], e["args"]["bytes written"]) == (read, written), (name, e["args"])
            assert e["args"]["bytes"] == read + written
        assert coll["all_reduce"]["args"]["Input Dims"][0] == [[1000]]


def test_kernels_inside_a_kernel_are_not_counted_twice():
    # relu's native kernel runs clamp_min's: one device event, so device times add up.
    a = torch.randn(64, 64, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        torch.relu(a)
    names = [e.key for e in prof.key_averages() if e.key.startswith("[neuron")]
    assert any(n.startswith("[neuron] aten::relu") for n in names), names
    assert not any("clamp_min" in n or "empty" in n for n in names), names
    avgs = {e.key: e for e in prof.key_averages()}
    assert avgs["aten::relu"].device_time_total == pytest.approx(
        sum(e.self_device_time_total for e in prof.key_averages() if e.key.startswith("[neuron")))
