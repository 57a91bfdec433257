"""Random state of the neuron generators (Philox: 16-byte state = uint64 seed + uint64 offset)."""

from typing import Iterable, List

import torch

from .. import _C


class _DefaultGenerators:
    """``torch.neuron.default_generators[i]``: the default torch.Generator of device i."""

    def __getitem__(self, idx: int) -> torch.Generator:
        from . import _lazy_init

        _lazy_init()
        n = _C._device_count()
        if not -n <= idx < n:
            raise IndexError(f"neuron device index {idx} out of range (device_count() = {n})")
        return _C._get_default_generator(idx % n)

    def __len__(self) -> int:
        return _C._device_count()

    def __iter__(self):
        return (self[i] for i in range(len(self)))


default_generators = _DefaultGenerators()


def _generator(device=None) -> torch.Generator:
    from . import _device_index

    return default_generators[_device_index(device)]


def get_rng_state(device="neuron") -> torch.Tensor:
    return _generator(device).get_state()


def get_rng_state_all() -> List[torch.Tensor]:
    return [g.get_state() for g in default_generators]


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    _generator(device).set_state(new_state.to("cpu", torch.uint8))


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seed the generator of the current device."""
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    s = _generator().seed()
    for g in default_generators:
        g.manual_seed(s)


def initial_seed() -> int:
    return _generator().initial_seed()
