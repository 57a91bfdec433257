"""torch.neuron.memory_summary(), memory history and snapshots in torch.cuda's formats: the snapshot's
segments and blocks agree with the allocator's statistics, recorded allocations carry the Python stack that
made them, torch.cuda._memory_viz renders the snapshot, and an out-of-memory error points at both tools."""
import pickle

import pytest
import torch
from torch.cuda import _memory_viz

import torch_neuronx  # noqa: F401


def _allocate_here(n):
    return torch.empty(n, dtype=torch.uint8, device="neuron")


def test_memory_summary_reports_the_allocator():
    keep = _allocate_here(3 << 20)
    s = torch.neuron.memory_summary()
    assert "PyTorch neuron memory summary, device ID 0" in s
    assert "Allocated memory" in s and "from large pool" in s and "Device reserved memory" in s
    assert "Allocated memory" in torch.neuron.memory_summary(abbreviated=True)
    del keep


def test_snapshot_matches_statistics_and_records_stacks(tmp_path):
    torch.neuron.memory._record_memory_history(max_entries=1000)
    try:
        a = _allocate_here(5 << 20)
        b = _allocate_here(1000)
        c = _allocate_here(2000)
        del c
        snap = torch.neuron.memory._snapshot()
    finally:
        torch.neuron.memory._record_memory_history(enabled=None)
    segs = [s for s in snap["segments"] if s["device"] == 0]
    stats = torch.neuron.memory_stats(0)
    assert sum(s["total_size"] for s in segs) == stats["reserved_bytes.all.current"]
    assert sum(s["allocated_size"] for s in segs) == stats["allocated_bytes.all.current"]
    for s in segs:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    blocks = {b["address"]: b for s in segs for b in s["blocks"]}
    for t, size in ((a, 5 << 20), (b, 1000)):
        blk = blocks[t.data_ptr()]
        assert blk["state"] == "active_allocated" and blk["requested_size"] == size
        assert any(f["name"] == "_allocate_here" and f["filename"].endswith("test_memory_snapshot.py")
                   for f in blk["frames"]), blk["frames"][:3]
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions.count("alloc") >= 3 and "free_completed" in actions
    freed = [e for e in snap["device_traces"][0] if e["action"] == "free_completed"]
    assert any(e["size"] == 2000 for e in freed)
    # PyTorch's visualiser renders it, and the dump is what pytorch.org/memory_viz opens.
    assert "<html" in _memory_viz.trace_plot(snap).lower()
    assert "<html" in _memory_viz.segment_plot(snap).lower()
    assert "segment" in _memory_viz.segsum(snap).lower()  # the text summaries (flamegraphs need a download)
    assert _memory_viz.trace(snap)
    path = tmp_path / "snap.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    assert "segments" in pickle.loads(path.read_bytes())
    del a, b


def test_recording_limits_and_stops():
    torch.neuron.memory._record_memory_history(max_entries=4)
    try:
        for _ in range(10):
            _allocate_here(100)
        assert len(torch.neuron.memory._snapshot()["device_traces"][0]) == 4
    finally:
        torch.neuron.memory._record_memory_history(enabled=None)
    _allocate_here(100)
    assert torch.neuron.memory._snapshot()["device_traces"][0] == []
    with pytest.raises(ValueError, match="enabled must be"):
        torch.neuron.memory._record_memory_history(enabled="sometimes")


def test_out_of_memory_names_the_tools_and_is_recorded(python):
    code = """
import torch
torch.neuron.memory._record_memory_history()
try:
    torch.empty(1 << 40, dtype=torch.uint8, device="neuron")
except torch.OutOfMemoryError as e:
    print("MSG", e)
print("OOM", [e["action"] for e in torch.neuron.memory._snapshot()["device_traces"][0]].count("oom"))
"""
    r = python(code, env={"NEURON_RT_MEMORY_PER_CORE": "64M"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "memory_summary()" in r.stdout and "_record_memory_history()" in r.stdout and "_snapshot()" in r.stdout
    assert "OOM 1" in r.stdout
