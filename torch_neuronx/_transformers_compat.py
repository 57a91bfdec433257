"""Transformers' ``Trainer`` checkpoints the neuron generator with its other RNG states.

``Trainer._save_rng_state`` writes python, numpy, CPU and the RNG states of the devices it knows (cuda, xpu, npu,
hpu, mlu, musa, xla) to ``rng_state[_<rank>].pth``, and ``_load_rng_state`` restores them; neuron's was missing, so
``resume_from_checkpoint`` of a run with dropout drew other masks than the uninterrupted run (a tiny Llama with
attention dropout 0.2: losses of steps 4-6 off by up to 4e-3). The wrappers add the neuron generator's state under
the key ``"neuron"`` (every device's, as for cuda, when distributed) and restore it when present.
"""

from __future__ import annotations

import functools
import os

import torch

from . import _post_import

_MODULE = "transformers.trainer"


def _rng_file(trainer, directory: str) -> str:
    if trainer.args.world_size <= 1:
        return os.path.join(directory, "rng_state.pth")
    return os.path.join(directory, f"rng_state_{trainer.args.process_index}.pth")


def _on_neuron(trainer) -> bool:
    try:
        return trainer.args.device.type == "neuron"
    except Exception:
        return False


def _patch(module) -> None:
    trainer_cls = module.Trainer
    save, load = trainer_cls._save_rng_state, trainer_cls._load_rng_state
    if getattr(save, "_neuron_compat", False):
        return

    @functools.wraps(save)
    def _save_rng_state(self, output_dir):
        save(self, output_dir)
        if not _on_neuron(self):
            return
        path = _rng_file(self, output_dir)
        with module.safe_globals():
            states = torch.load(path, weights_only=True)
        distributed = self.args.world_size > 1
        states["neuron"] = torch.neuron.get_rng_state_all() if distributed else torch.neuron.get_rng_state()
        torch.save(states, path)

    @functools.wraps(load)
    def _load_rng_state(self, checkpoint):
        load(self, checkpoint)
        if checkpoint is None or not _on_neuron(self):
            return
        path = _rng_file(self, checkpoint)
        if not os.path.isfile(path):
            return
        with module.safe_globals():
            states = torch.load(path, weights_only=True)
        state = states.get("neuron")
        if state is None:
            return
        if isinstance(state, (list, tuple)):
            torch.neuron.set_rng_state_all(state)
        else:
            torch.neuron.set_rng_state(state)

    _save_rng_state._neuron_compat = True
    trainer_cls._save_rng_state = _save_rng_state
    trainer_cls._load_rng_state = _load_rng_state


def install() -> None:
    _post_import.when_loaded(_MODULE, "Trainer", _patch)
