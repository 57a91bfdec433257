import torch

from .. import vit_mlp


class ViTMLP(torch.nn.Module):
    """Forward of transformers' ``ViTMLP`` (``fc1`` -> GELU -> ``fc2``) as one fused NKI kernel. It uses the
    replaced module's ``fc1``/``fc2`` and assumes ``hidden_act="gelu"`` (ViT's default: exact, erf-based);
    inference only."""

    has_backward = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if getattr(self.config, "hidden_act", "gelu") != "gelu":  # the kernel fuses exact GELU only
            return self.fc2(self.activation_fn(self.fc1(hidden_states)))
        return vit_mlp(hidden_states, self.fc1, self.fc2)
