"""A process started by a launcher (torchrun, accelerate launch: LOCAL_RANK set) computes on neuron:LOCAL_RANK
with no code in the script; NEURON_RT_VISIBLE_CORES giving a process one core binds it to that core; an
explicit set_device wins; more processes per host than cores make the neuron process group fail at once on
every rank, naming the counts."""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import os, torch, torch.distributed as dist
rank = int(os.environ["LOCAL_RANK"])
if os.environ.get("EXPECT_BOUND", "1") == "1":
    assert torch.neuron.current_device() == rank, (torch.neuron.current_device(), rank)
    assert torch.accelerator.current_device_index() == rank
x = torch.ones(3, device="neuron") * (rank + 1)
assert x.device == torch.device("neuron", torch.neuron.current_device()), x.device
dist.init_process_group(backend="neuron")
dist.all_reduce(x)
print(f"rank {rank} on {x.device}: {x.tolist()}", flush=True)
dist.destroy_process_group()
"""


def _torchrun(tmp_path, nproc, env=None, timeout=150):
    script = tmp_path / "bind.py"
    script.write_text(SCRIPT)
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone", str(script)]
    return subprocess.run(cmd, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_torchrun_ranks_compute_on_their_own_core(tmp_path):
    proc = _torchrun(tmp_path, 2)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "rank 0 on neuron:0: [3.0, 3.0, 3.0]" in out and "rank 1 on neuron:1: [3.0, 3.0, 3.0]" in out, out


def test_more_processes_than_cores_fail_on_every_rank(tmp_path):
    start = time.monotonic()
    proc = _torchrun(tmp_path, 3, env={"NEURON_RT_NUM_CORES": "2", "EXPECT_BOUND": "0"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert time.monotonic() - start < 120  # no rank waits out the group timeout
    msg = "3 processes on this host (LOCAL_WORLD_SIZE) but 2 NeuronCores are visible (NEURON_RT_NUM_CORES=2)"
    assert out.count(msg) >= 3, out[-4000:]  # each rank raises (torchrun may print each twice)


def test_one_visible_core_per_process_and_explicit_set_device(python):
    code = "import torch; print(torch.neuron.device_count(), torch.neuron.current_device())"
    one = python(code, env={"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NEURON_RT_VISIBLE_CORES": "3"})
    assert one.returncode == 0 and one.stdout.split() == ["1", "0"], one.stderr[-2000:]
    code = ("import torch; a = torch.neuron.current_device(); torch.neuron.set_device(0); "
            "print(a, torch.neuron.current_device(), torch.empty(1, device='neuron').device)")
    r = python(code, env={"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert r.returncode == 0 and r.stdout.split() == ["1", "0", "neuron:0"], r.stderr[-2000:]
    r = python("import torch; print(torch.neuron.current_device())", env={"LOCAL_RANK": "2"})
    assert r.stdout.split() == ["2"], r.stderr  # launchers that set LOCAL_RANK alone (deepspeed, mpirun wrappers)
