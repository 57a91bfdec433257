"""torch.profiler on neuron: device kernels (native, fallback, collective, compiled graph) in the
key_averages() table and in the exported Chrome trace (csrc/aten/neuron_profiler.cpp)."""

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
    # Device rows are labelled as the neuron device.
    names = {(e["pid"], e["args"].get("name")) for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert (mm["pid"], "neuron") in names


def test_compiled_graph_is_one_event_holding_its_kernels(run):
    _, events, _ = run
    kernels = _kernels(events)
    graphs = [e for e in kernels if e["name"].startswith("[neuron graph]")]
    assert len(graphs) == 1 and graphs[0]["args"]["kind"] == "compiled graph"
    g = graphs[0]
    inside = [e for e in kernels if e is not g and e["pid"] == g["pid"] and e["tid"] == g["tid"]
              and g["ts"] <= e["ts"] and e["ts"] + e["dur"] <= g["ts"] + g["dur"] + 1e-3]
    # The graph's extern GEMM (t @ t.T) runs as a native kernel inside the graph's range.
    assert any(e["name"].startswith("[neuron] aten::mm") for e in inside), [e["name"] for e in inside]


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
        dist.all_reduce(t)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], record_shapes=True) as p:
            dist.all_reduce(t)
            torch.neuron.synchronize()
        assert t[0].item() == 4.0
        p.export_chrome_trace(sys.argv[1] + f".{rank}.json")
        dist.destroy_process_group()
    """))
    out = str(tmp_path / "trace")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(worker), out]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(2):
        with open(f"{out}.{rank}.json") as fh:
            kernels = _kernels(json.load(fh)["traceEvents"])
        coll = [e for e in kernels if e["name"].startswith("[neuron collective]")]
        assert coll, [e["name"] for e in kernels]
        assert coll[0]["args"]["kind"] == "collective" and coll[0]["dur"] > 0
        assert coll[0]["args"]["bytes"] == 4000 and coll[0]["args"]["device"] == rank
        assert coll[0]["args"]["Input Dims"][0] == [[1000]]


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
