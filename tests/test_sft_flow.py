"""The launch post's TRL SFT script (examples/sft_neuron_example.py, verbatim) with the launch command scaled down:
only the model and dataset (examples/make_tiny_sft.py: tiny random Qwen3, UltraChat-like local data), sizes and step
counts change. Each mode runs as the user would (a subprocess, torchrun for several ranks) and is compared with the
same script on CPU in one process (`--use_cpu true`).

Equal math with the CPU run: tensor-parallel ranks share their data, FSDP ranks each take their own micro-batches,
so the global batch of a step is per_device x grad_accum x FSDP_SIZE sequences. The Trainer's batch sampler is one
seeded permutation split into micro-batches of per_device sequences; data-parallel rank r of D takes micro-batch
k*D + r. So a step of D ranks with grad_accum A covers exactly the sequences of one CPU process with grad_accum A*D
(same per_device), and the loss (token mean over the step, token counts summed across ranks) is the same number.

Tolerances (fp32): the logged loss of every step within rtol 1e-4 of CPU's, grad_norm within rtol 1e-3. Only the
order of fp32 sums differs (blocked GEMM, all_reduce/reduce_scatter across ranks, Inductor fusion): measured loss
differences are <= 1e-5 relative over 4 steps; taking another step's data (a sharding or sampler bug) moves the loss
by >= 1e-3 relative here. The saved checkpoint (`trainer.save_model`) loads on CPU with AutoModelForCausalLM and
equals bit for bit the weights the run trained (gathered from DTensor shards by a wrapper that runs the unchanged
script with runpy and records the model's state dict when save_model is called). Against CPU's trained weights
only a bound holds: Adam moves an element by about lr per step whatever the gradient's size, so an element whose
gradient is ~0 can move either way: |w - w_cpu| <= 2 x sum of learning rates.

Compiled (`--torch_compile true`, TRL's default gradient checkpointing on): every graph compiles before the first
logged step (nothing recompiles later, TRL pads to multiples of 128 tokens on neuron) and the compile report
(TORCH_NEURONX_COMPILE_REPORT=1) shows no recompile and no graph break but TRL's own `torch.mm(out=<non-contiguous
view>)` in trl/kernels/chunked_logprob.py, which Dynamo refuses on every device (CPU Inductor reports the same),
and with ranks FSDP2's hooks (run under torch._dynamo.disable by FSDP2) and Transformers TP's first-forward hook
registration inside the checkpointed region (LIBRARY_GRAPH_BREAKS).

Default suite (~4.5 min on 2 idle cores, most of it compiling): one process eager and compiled, torchrun 4 ranks
TP 2 x FSDP 2 eager, and the bad-input case. RUN_SLOW=1 adds 4 ranks compiled and 2 ranks pure FSDP / pure TP.
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("trl")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "sft_neuron_example.py")
sys.path.insert(0, os.path.join(ROOT, "examples"))
import make_tiny_sft  # noqa: E402

slow = pytest.mark.slow

STEPS = 4
LR = 1e-3
PER_DEVICE = 2
ACCUM = 2
LOSS_RTOL = 1e-4
GRAD_NORM_RTOL = 1e-3

# Runs the example unchanged as __main__, and records the trained weights (full tensors) when it saves the model.
CAPTURE = r"""
import os, runpy, sys
import torch
import trl

_save_model = trl.SFTTrainer.save_model

def save_model(self, output_dir=None, _internal_call=False):
    if not _internal_call:
        state = {}
        for k, v in self.model.state_dict().items():
            if hasattr(v, "full_tensor"):
                v = v.full_tensor()
            state[k.replace("_orig_mod.", "")] = v.detach().to("cpu").clone()
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save(state, os.path.join(output_dir or self.args.output_dir, "trained_weights.pt"))
    return _save_model(self, output_dir, _internal_call)

trl.SFTTrainer.save_model = save_model

# SFT_DIE_RANK / SFT_DIE_STEP: that rank exits without a word in the middle of that optimizer step's micro-batches.
if os.environ.get("SFT_DIE_RANK") == os.environ.get("RANK", "0"):
    _training_step = trl.SFTTrainer.training_step
    _calls = [0]

    def training_step(self, *args, **kwargs):
        _calls[0] += 1
        if self.state.global_step + 1 == int(os.environ["SFT_DIE_STEP"]) and _calls[0] % 2 == 0:
            os._exit(3)
        return _training_step(self, *args, **kwargs)

    trl.SFTTrainer.training_step = training_step
script = sys.argv.pop(1)
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
"""


def sft_args(data, out, accum=ACCUM, extra=()):
    """The launch command's arguments, scaled down."""
    return ["--model_name_or_path", str(data["model"]), "--dataset_name", str(data["data"]),
            "--dataset_train_split", "train_sft", "--output_dir", str(out), "--dtype", "float32",
            "--max_length", "128", "--packing", "true", "--packing_strategy", "wrapped",
            "--learning_rate", str(LR), "--warmup_steps", "0.03", "--num_train_epochs", "1",
            "--max_steps", str(STEPS), "--logging_steps", "1", "--per_device_train_batch_size", str(PER_DEVICE),
            "--gradient_accumulation_steps", str(accum), "--save_only_model", "true", "--report_to", "none",
            *extra]


def run_sft(tmp, data, out, nproc=1, accum=ACCUM, extra=(), env=None, timeout=400, check=True):
    capture = tmp / "capture_sft.py"
    capture.write_text(CAPTURE)
    full_env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DEACTIVATE_ASYNC_LOAD="1", PYTHONUNBUFFERED="1",
                    HF_DATASETS_CACHE=str(tmp / "hf-datasets"), TRANSFORMERS_VERBOSITY="error",
                    TORCH_NEURONX_COMPILE_REPORT="1")
    if nproc > 1:
        full_env["OMP_NUM_THREADS"] = "1"
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    else:
        launcher = [sys.executable]
    full_env.update(env or {})
    cmd = launcher + [str(capture), SCRIPT] + sft_args(data, out, accum, extra)
    start = time.monotonic()
    proc = subprocess.run(cmd, env=full_env, cwd=str(tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    proc.seconds = time.monotonic() - start
    if check:
        assert proc.returncode == 0, proc.stdout[-8000:]
    return proc


def log_history(out):
    with open(os.path.join(out, f"checkpoint-{STEPS}", "trainer_state.json")) as f:
        hist = [h for h in json.load(f)["log_history"] if "loss" in h]
    assert [h["step"] for h in hist] == list(range(1, STEPS + 1)), hist
    return hist


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_tiny_sft.make(str(tmp_path_factory.mktemp("tiny-sft")))


@pytest.fixture(scope="module")
def cpu_ref(data, tmp_path_factory):
    """grad_accum -> output directory of the one-process CPU run."""
    runs = {}

    def get(accum):
        if accum not in runs:
            tmp = tmp_path_factory.mktemp(f"cpu-accum{accum}")
            run_sft(tmp, data, tmp / "out", accum=accum, extra=["--use_cpu", "true"])
            runs[accum] = tmp / "out"
        return runs[accum]

    return get


def load_cpu(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, device_map="cpu").state_dict()


def check_against_cpu(out, ref, label):
    got, want = log_history(out), log_history(ref)
    loss_rel = [abs(g["loss"] - w["loss"]) / abs(w["loss"]) for g, w in zip(got, want)]
    gn_rel = [abs(g["grad_norm"] - w["grad_norm"]) / abs(w["grad_norm"]) for g, w in zip(got, want)]
    print(f"{label}: loss {[round(g['loss'], 5) for g in got]} vs CPU {[round(w['loss'], 5) for w in want]}: "
          f"max rel diff {max(loss_rel):.2e}; grad_norm max rel diff {max(gn_rel):.2e}")
    assert max(loss_rel) <= LOSS_RTOL, (got, want)
    assert max(gn_rel) <= GRAD_NORM_RTOL, (got, want)
    assert [g["num_tokens"] for g in got] == [w["num_tokens"] for w in want]

    # The checkpoint loads on CPU and is exactly what was trained.
    saved = load_cpu(out)
    trained = torch.load(os.path.join(out, "trained_weights.pt"))
    assert set(saved) == set(trained), (set(saved) ^ set(trained))
    for k in saved:
        assert saved[k].device.type == "cpu" and torch.equal(saved[k], trained[k]), k
    # And is close to CPU's trained weights, within what Adam's sign-like steps allow.
    cpu = load_cpu(ref)
    bound = 2 * sum(h["learning_rate"] for h in want)
    worst = max((saved[k] - cpu[k]).abs().max().item() for k in cpu)
    print(f"{label}: checkpoint equals the trained weights; max |w - w_cpu| {worst:.2e} (bound {bound:.2e})")
    assert worst <= bound


# Graph breaks of the libraries themselves, on any device (none comes from torch_neuronx or the neuron backend):
LIBRARY_GRAPH_BREAKS = [
    # TRL: torch.mm(out=<a column slice of a wider buffer>); CPU Inductor reports the same break.
    ("trl/kernels/chunked_logprob.py", "non-contiguous `out=`"),
    # FSDP2 runs its hooks under torch._dynamo.disable (reason "skipping FSDP hooks") on every device.
    ("torch/distributed/fsdp/_fully_shard/_fsdp_common.py", "marked as skipped"),
    # Transformers TP registers gradient all-reduce hooks on the first forward, inside the checkpoint HOP.
    ("transformers/distributed/tensor_parallel.py", "Unsafe side effect"),
]


def check_compiled(proc):
    out = proc.stdout
    first_log = out.index("{'loss'")
    compiles = [m.start() for m in re.finditer(r"\[neuron\] compiled graph", out)]
    assert compiles, out[-4000:]
    assert max(compiles) < first_log, "a graph compiled after the first logged step:\n" + out[-6000:]
    reports = out.count("torch_neuronx compile report")
    assert reports >= 1
    assert len(re.findall(r"^  recompiles: 0$", out, re.M)) == reports, out[-6000:]
    for m in re.finditer(r"^  graph breaks: (\d+)\n((?:    .*\n?)*)", out, re.M):
        for line in m.group(2).splitlines():
            assert "torch_neuronx" not in line and "neuron" not in line.split(": ", 1)[1].lower(), line
            assert any(where in line and why in line for where, why in LIBRARY_GRAPH_BREAKS), line


def test_one_process_eager(data, cpu_ref, tmp_path):
    proc = run_sft(tmp_path, data, tmp_path / "out")
    assert "compiled graph" not in proc.stdout
    check_against_cpu(tmp_path / "out", cpu_ref(ACCUM), f"eager 1 process ({proc.seconds:.0f} s)")


def test_one_process_compiled(data, cpu_ref, tmp_path):
    proc = run_sft(tmp_path, data, tmp_path / "out", extra=["--torch_compile", "true"], timeout=500)
    check_compiled(proc)
    check_against_cpu(tmp_path / "out", cpu_ref(ACCUM), f"compiled 1 process ({proc.seconds:.0f} s)")


@pytest.mark.parametrize("tp,fsdp", [(2, 2), pytest.param(1, 2, marks=slow), pytest.param(2, 1, marks=slow)],
                         ids=["tp2xfsdp2", "fsdp2", "tp2"])
def test_torchrun_eager(tp, fsdp, data, cpu_ref, tmp_path):
    proc = run_sft(tmp_path, data, tmp_path / "out", nproc=tp * fsdp,
                   env={"TP_SIZE": str(tp), "FSDP_SIZE": str(fsdp)})
    check_against_cpu(tmp_path / "out", cpu_ref(ACCUM * fsdp),
                      f"eager torchrun TP {tp} x FSDP {fsdp} ({proc.seconds:.0f} s)")


@slow
def test_torchrun_compiled_tp2_fsdp2(data, cpu_ref, tmp_path):
    proc = run_sft(tmp_path, data, tmp_path / "out", nproc=4, extra=["--torch_compile", "true"],
                   env={"TP_SIZE": "2", "FSDP_SIZE": "2"}, timeout=1200)
    check_compiled(proc)
    check_against_cpu(tmp_path / "out", cpu_ref(ACCUM * 2), f"compiled torchrun TP 2 x FSDP 2 ({proc.seconds:.0f} s)")


def test_mesh_not_matching_world_size_fails_on_every_rank(data, tmp_path):
    """TP_SIZE x FSDP_SIZE != WORLD_SIZE: every rank raises, naming both counts, well within the group timeout, and
    nothing of ours is left in /dev/shm."""
    before = set(os.listdir("/dev/shm"))
    proc = run_sft(tmp_path, data, tmp_path / "out", nproc=2, env={"TP_SIZE": "2", "FSDP_SIZE": "2"}, timeout=200,
                   check=False)
    assert proc.returncode != 0
    assert proc.seconds < 120
    for rank in (0, 1):
        assert f"[rank{rank}]: RuntimeError: The parallel mesh requires 4 processes, but world_size is 2" in proc.stdout, \
            proc.stdout[-4000:]
    leaked = {e for e in set(os.listdir("/dev/shm")) - before if "neuron" in e or "ncl" in e}
    assert not leaked, leaked


def test_rank_dying_mid_step_stops_every_rank(data, tmp_path):
    """Rank 1 of TP 2 x FSDP 2 exits in the middle of step 2: the job ends well within the group timeout (torchrun
    stops the other ranks), no shared memory segment is left in /dev/shm."""
    before = set(os.listdir("/dev/shm"))
    proc = run_sft(tmp_path, data, tmp_path / "out", nproc=4, check=False, timeout=300,
                   env={"TP_SIZE": "2", "FSDP_SIZE": "2", "SFT_DIE_RANK": "1", "SFT_DIE_STEP": "2"})
    print(f"rank died mid-step: job ended in {proc.seconds:.0f} s")
    assert proc.returncode != 0
    assert "exitcode  : 3" in proc.stdout, proc.stdout[-4000:]
    assert proc.seconds < 150
    # A killed process cannot remove its statistics file (neuron-stats-<pid>): by design the next reader
    # (neuron-ls / neuron-top) removes those of dead processes. Memory segments and workspaces must be gone.
    leaked = {e for e in set(os.listdir("/dev/shm")) - before
              if ("neuron" in e or "ncl" in e) and not e.startswith("neuron-stats-")}
    assert not leaked, leaked
