"""torch.distributed on neuron: torchrun with 2 ranks runs tests/distributed_worker.py scenarios."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "distributed_worker.py")


def _shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def torchrun(scenario, nproc=2, extra_env=None, timeout=170):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           WORKER, scenario]
    before = _shm_entries()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"torchrun {scenario} failed:\n{out[-6000:]}"
    # Workspaces are memfds: nothing may be left in /dev/shm (entries of other processes may come and go,
    # so only names that could be ours are checked).
    leaked = {e for e in _shm_entries() - before if "neuron" in e or "ncl" in e}
    assert not leaked, leaked
    return out


def test_collectives_shared_memory():
    out = torchrun("collectives")
    assert out.count("OK collectives") == 2 and "shared memory: True" in out, out[-3000:]


def test_collectives_forced_gloo():
    out = torchrun("collectives", extra_env={"TORCH_NEURONX_DIST_FORCE_GLOO": "1"})
    assert out.count("OK collectives") == 2 and "shared memory: False" in out, out[-3000:]


def test_ddp_fsdp2_tensor_parallel():
    out = torchrun("training")
    for tag in ("OK DDP", "OK FSDP2", "OK TP", "OK DTensor random", "OK training"):
        assert out.count(tag) == 2, (tag, out[-3000:])


def test_dead_peer_raises():
    out = torchrun("dead_peer")
    assert "OK dead peer raised" in out and "exited" in out, out[-3000:]
