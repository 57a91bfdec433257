"""`python -m torch_neuronx` (ls / top / check), the statistics segments behind them, and their clean-up."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOLDER = """
import sys, time, torch
x = torch.empty(8 << 20, dtype=torch.uint8, device="neuron").fill_(1)
for _ in range(50):
    x.add_(1)
print("ready", flush=True)
while True:
    x.add_(1)
    time.sleep(0.01)
"""


@pytest.fixture
def stats_env(tmp_path):
    env = dict(os.environ, NEURON_RT_STATS_DIR=str(tmp_path), NEURON_RT_STATS_INTERVAL_MS="50")
    env.pop("NEURON_RT_STATS", None)
    return env


def _cli(args, env, timeout=300, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "torch_neuronx", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def _start_holder(env):
    p = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # a refresh of its segment
    return p


def test_ls_json_shows_process_and_cleans_up_after_sigkill(stats_env, tmp_path):
    p = _start_holder(stats_env)
    try:
        seg = tmp_path / f"neuron-stats-{p.pid}"
        assert seg.exists()
        r = _cli(["ls", "--json"], stats_env)
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        assert data["versions"]["torch"].startswith("2.13.0")
        assert len(data["cores"]) == 4 and data["cores"][0]["physical_cores"] == [0, 1]
        procs = {q["pid"]: q for q in data["processes"]}
        assert p.pid in procs and os.getpid() not in procs
        mine = procs[p.pid]
        assert "import sys, time, torch" in mine["cmdline"] or "-c" in mine["cmdline"]
        assert [c["physical_index"] for c in mine["cores"]] == [0]
        assert mine["cores"][0]["allocated"] >= 8 << 20 and mine["native_ops"] >= 50
        core0 = data["cores"][0]
        assert any(q["pid"] == p.pid and q["allocated"] >= 8 << 20 for q in core0["processes"])
        assert core0["allocated"] >= 8 << 20
        text = _cli(["ls"], stats_env).stdout
        assert str(p.pid) in text and "NC" in text
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert seg.exists()  # SIGKILL ran nothing
    data = json.loads(_cli(["ls", "--json"], stats_env).stdout)
    assert p.pid not in {q["pid"] for q in data["processes"]}
    assert not seg.exists()


def test_segment_removed_at_exit_and_off_switch(stats_env, tmp_path):
    code = "import torch, os; torch.ones(4, device='neuron'); print(os.getpid())"
    r = subprocess.run([sys.executable, "-c", code], env=stats_env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / f"neuron-stats-{r.stdout.strip()}").exists()
    code = "import torch, os, time; torch.ones(4, device='neuron'); print(os.listdir(os.environ['NEURON_RT_STATS_DIR']))"
    r = subprocess.run([sys.executable, "-c", code], env=dict(stats_env, NEURON_RT_STATS="0"), capture_output=True,
                       text=True, timeout=300)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def test_top_once_and_clean_exit(stats_env):
    p = _start_holder(stats_env)
    try:
        r = subprocess.run([sys.executable, "-m", "torch_neuronx", "top", "--once", "--interval", "0.5", "--json"],
                           env=stats_env, capture_output=True, text=True, timeout=300, cwd=REPO)
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)["rows"]
        row = [x for x in rows if x["pid"] == p.pid]
        assert row and row[0]["physical_core"] == 0 and row[0]["allocated"] >= 8 << 20
        assert row[0]["ops_per_s"] > 10 and row[0]["busy_pct"] > 0
        text = _cli(["top", "--iterations", "2", "--interval", "0.2"], stats_env).stdout
        assert text.count("neuron-top") == 2 and str(p.pid) in text
        for sig in (signal.SIGINT, signal.SIGHUP):  # Ctrl-C, closed terminal
            t = subprocess.Popen([sys.executable, "-m", "torch_neuronx", "top", "--iterations", "1000",
                                  "--interval", "0.1"], env=stats_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=REPO)
            assert "neuron-top" in t.stdout.readline()
            t.send_signal(sig)
            _, err = t.communicate(timeout=60)
            assert t.returncode == 0 and "Traceback" not in err, err
    finally:
        p.kill()
        p.wait()


def _check(env, cwd=REPO):
    r = _cli(["check", "--json"], env, cwd=cwd)
    return r.returncode, json.loads(r.stdout)["problems"]


def test_check_ok_autoload_and_bad_env(stats_env):
    rc, problems = _check(stats_env)
    assert rc == 0 and problems == []
    rc, problems = _check(dict(stats_env, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert rc == 1 and [p["problem"] for p in problems] == ["autoload disabled"]
    rc, problems = _check(dict(stats_env, NEURON_RT_VISIBLE_CORES="banana"))
    assert rc == 1 and problems[0]["problem"] == "bad NEURON_RT_VISIBLE_CORES value"
    assert "banana" in problems[0]["detail"]
    rc, problems = _check(dict(stats_env, NEURON_LOGICAL_NC_CONFIG="3"))
    assert rc == 1 and problems[0]["problem"] == "bad NEURON_LOGICAL_NC_CONFIG value"


def _package_copy(tmp_path, with_extension=True, torch_version=None):
    dst = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__", *([] if with_extension else ["_C*.so"]))
    shutil.copytree(os.path.join(REPO, "torch_neuronx"), dst / "torch_neuronx", ignore=ignore)
    if torch_version:
        (dst / "torch_neuronx" / "_build_info.py").write_text(f'torch_version = "{torch_version}"\n')
    return str(dst)


def test_check_extension_not_built_and_torch_mismatch(stats_env, tmp_path):
    site = _package_copy(tmp_path / "a", with_extension=False)
    rc, problems = _check(dict(stats_env, PYTHONPATH=site), cwd=str(tmp_path))
    assert rc == 1 and "extension not built" in [p["problem"] for p in problems]
    site = _package_copy(tmp_path / "b", torch_version="2.12.0+cpu")
    rc, problems = _check(dict(stats_env, PYTHONPATH=site), cwd=str(tmp_path))
    mismatch = [p for p in problems if p["problem"] == "torch version mismatch"]
    assert rc == 1 and mismatch and "2.12.0" in mismatch[0]["detail"] and "2.13.0" in mismatch[0]["detail"]
    # ls still reports what it can when the extension cannot load (here: a bad environment).
    r = _cli(["ls", "--json"], dict(stats_env, NEURON_RT_NUM_CHIPS="0"))
    data = json.loads(r.stdout)
    assert r.returncode == 0 and "NEURON_RT_NUM_CHIPS" in data["cores_error"] and data["versions"]["torch"]


@pytest.mark.parametrize("script", ["neuron-ls", "neuron-top"])
def test_console_scripts(stats_env, tmp_path, script):
    path = os.path.join(os.path.dirname(sys.executable), script)
    if not os.path.exists(path):
        pytest.skip(f"{script} not installed (pip install --no-build-isolation -e .)")
    args = ["--json"] if script == "neuron-ls" else ["--once", "--interval", "0.1"]
    r = subprocess.run([path, *args], env=stats_env, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert ("versions" in json.loads(r.stdout)) if script == "neuron-ls" else ("neuron-top" in r.stdout)
