"""torch.distributed on neuron: torchrun with 2 (and once 4) ranks runs tests/distributed_worker.py scenarios."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "distributed_worker.py")


def _shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def torchrun(scenario, nproc=2, extra_env=None, timeout=170, args=()):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           WORKER, scenario, *args]
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


def test_collectives_4_ranks():
    # 4 ranks on a 2-core machine: waits must yield to the ranks that hold the cores.
    out = torchrun("collectives", nproc=4)
    assert out.count("OK collectives") == 4 and "shared memory: True" in out, out[-3000:]


@pytest.mark.parametrize("when", ["between", "inside"])
def test_dead_peer_raises(when):
    out = torchrun("dead_peer", args=[when])
    assert "OK dead peer raised" in out and "exited" in out, out[-3000:]


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stats_files():
    try:
        return set(os.listdir("/dev/shm/neuron-stats"))
    except OSError:
        return set()


@pytest.mark.parametrize("nproc", [2, 4])
def test_kill_9_inside_collectives(nproc):
    """SIGKILL of the last rank in the middle of a stream of collectives: every other rank raises within the
    group timeout, exits normally, and nothing of the job stays in /dev/shm (workspaces are memfds; the killed
    rank's statistics file is removed by the ranks that outlive it)."""
    import random
    import signal
    import time

    port = _free_port()
    before, stats_before = _shm_entries(), _stats_files()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
                   RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NEURON_DIST_TEST_DEADLINE="120")
        procs.append(subprocess.Popen([sys.executable, WORKER, "killed_peer"], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        ready = 0
        lines = {i: [] for i in range(nproc)}
        deadline = time.time() + 150
        for i, p in enumerate(procs):  # each rank prints READY after its first all_reduce
            for line in p.stdout:
                lines[i].append(line)
                if "READY" in line:
                    ready += 1
                    break
                assert time.time() < deadline, "".join(lines[i])
        assert ready == nproc, lines
        time.sleep(random.uniform(0.05, 0.5))
        victim = procs[-1]
        victim.send_signal(signal.SIGKILL)
        t_kill = time.time()
        victim.wait(timeout=30)
        assert victim.returncode == -signal.SIGKILL
        for i, p in enumerate(procs[:-1]):
            rest, _ = p.communicate(timeout=90)
            out = "".join(lines[i]) + rest
            assert p.returncode == 0, out[-4000:]
            assert "OK killed peer raised" in out, out[-4000:]
        elapsed = time.time() - t_kill
        assert elapsed < 60, elapsed  # the group timeout
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    leaked = {e for e in _shm_entries() - before if "neuron" in e or "ncl" in e}
    assert not leaked, leaked
    pids = {f"neuron-stats-{p.pid}" for p in procs}
    assert not (_stats_files() & pids), _stats_files() & pids


def test_transformers_tensor_parallel_generate(tmp_path):
    """from_pretrained(distributed_config=DistributedConfig(tp_size=2), device_mesh=DeviceMesh("neuron", ...)),
    static-cache greedy generation: the tokens of one neuron device and of CPU (see the worker's scenario)."""
    from torch_neuronx.testing.tiny_models import make_tiny_llama

    paths = []
    for kind in ("llama", "qwen3"):
        paths.append(str(tmp_path / kind))
        make_tiny_llama(paths[-1], model_type=kind)
    out = torchrun("tp_generate", args=paths)
    assert out.count("OK tp generate") == 2, out[-3000:]
