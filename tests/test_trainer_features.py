"""Transformers Trainer features users turn on, on neuron (one process): gradient accumulation with gradient
clipping, the evaluation loop, --bf16, and save_steps + resume_from_checkpoint ending identical to an uninterrupted
run (with dropout on, so the neuron generator's state must be checkpointed too).

fp32 runs are compared with the same Trainer on CPU (use_cpu=True): losses within 1e-4 relative (fp32 sum order
only, see tests/test_sft_flow.py); eval loss within 1e-4 relative. The resumed run is compared with the
uninterrupted neuron run: bit-equal losses and weights (same device, same kernels, same RNG draws). Trainer saves
no neuron RNG state itself (torch_neuronx._transformers_compat adds it): with attention dropout 0.2 the resumed
losses were off by up to 4e-3 before.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from torch_neuronx.testing.tiny_models import make_tiny_llama  # noqa: E402


def datasets(vocab, n_train=32, n_eval=8, length=32):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (n_train + n_eval, length), generator=g)
    rows = [{"input_ids": r, "labels": r.clone()} for r in ids]
    return rows[:n_train], rows[n_train:]


def train(base_dir, out, dropout=0.0, resume=None, **kw):
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attention_dropout=dropout)
    train_ds, eval_ds = datasets(model.config.vocab_size)
    args = dict(output_dir=str(out), max_steps=6, per_device_train_batch_size=2, per_device_eval_batch_size=4,
                gradient_accumulation_steps=2, max_grad_norm=0.5, learning_rate=3e-3, warmup_steps=0, seed=0,
                logging_steps=1, eval_strategy="steps", eval_steps=3, save_steps=3, report_to=[],
                dataloader_num_workers=0, disable_tqdm=True)
    args.update(kw)
    trainer = Trainer(model=model, args=TrainingArguments(**args), train_dataset=train_ds, eval_dataset=eval_ds)
    trainer.train(resume_from_checkpoint=resume)
    hist = trainer.state.log_history
    losses = {h["step"]: h["loss"] for h in hist if "loss" in h}
    evals = {h["step"]: h["eval_loss"] for h in hist if "eval_loss" in h}
    weights = {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}
    return trainer, losses, evals, weights


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_llama(d)
    return d


def rel(a, b):
    return max(abs(a[k] - b[k]) / abs(b[k]) for k in b)


def test_accumulation_clipping_eval_equal_cpu(base_dir, tmp_path):
    trainer, losses, evals, _ = train(base_dir, tmp_path / "neuron")
    assert trainer.args.device.type == "neuron"
    _, cpu_losses, cpu_evals, _ = train(base_dir, tmp_path / "cpu", use_cpu=True)
    grad_norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    print(f"losses {losses}\nCPU {cpu_losses}\neval {evals} CPU {cpu_evals}; grad norms {grad_norms}")
    assert max(grad_norms) > 0.5  # clipping is active
    assert sorted(losses) == list(range(1, 7)) and sorted(evals) == [3, 6]
    assert rel(losses, cpu_losses) <= 1e-4 and rel(evals, cpu_evals) <= 1e-4


def test_bf16(base_dir, tmp_path):
    trainer, losses, evals, _ = train(base_dir, tmp_path / "neuron", bf16=True)
    _, cpu_losses, _, _ = train(base_dir, tmp_path / "cpu", use_cpu=True)
    print(f"bf16 losses {losses} vs fp32 CPU {cpu_losses}")
    assert all(torch.isfinite(torch.tensor(list(losses.values()))))
    assert rel(losses, cpu_losses) <= 2e-2  # bf16 autocast: ~3 significant digits per matmul
    assert losses[6] < losses[1]


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_resume_from_checkpoint_equals_uninterrupted(dropout, base_dir, tmp_path):
    _, losses, evals, weights = train(base_dir, tmp_path / "full", dropout=dropout)
    _, r_losses, r_evals, r_weights = train(base_dir, tmp_path / "full", dropout=dropout,
                                            resume=str(tmp_path / "full" / "checkpoint-3"))
    print(f"dropout {dropout}: uninterrupted {losses}\nresumed {r_losses}")
    assert "neuron" in torch.load(tmp_path / "full" / "checkpoint-3" / "rng_state.pth", weights_only=False)
    # The resumed trainer's history starts with the checkpoint's (steps 1-3).
    assert {k: v for k, v in losses.items() if k > 3} == {k: v for k, v in r_losses.items() if k > 3}
    assert evals[6] == r_evals[6]
    for k in weights:
        assert torch.equal(weights[k], r_weights[k]), k


def test_rng_checkpoint_patch_when_transformers_imported_first(python):
    """`from transformers import Trainer` as a script's first line imports torch (so torch_neuronx) from inside
    transformers.trainer, before Trainer exists: the patch lands when the device is first probed."""
    r = python("from transformers import Trainer\nimport torch\nassert torch.neuron.is_available()\n"
               "print(getattr(Trainer._save_rng_state, '_neuron_compat', False))")
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stdout + r.stderr[-3000:]
