import torch

from .. import relu


class ReLU(torch.nn.Module):
    """Drop-in forward for a ``ReLU``-tagged layer (``forward(self, x)``). It has a backward (an NKI kernel too)
    when torch_neuronx is importable, so ``kernelize(..., mode=Mode.TRAINING)`` accepts it; the custom ops have
    fake implementations, so ``Mode.TORCH_COMPILE`` keeps it under ``torch.compile(fullgraph=True)`` too."""

    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu(x)
