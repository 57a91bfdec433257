import torch

from .. import vit_ln_mlp, vit_mlp


class ViTMLP(torch.nn.Module):
    """Forward of transformers' ``ViTMLP`` (``fc1`` -> GELU -> ``fc2``) as one fused NKI kernel. It uses the
    replaced module's ``fc1``/``fc2`` and assumes ``hidden_act="gelu"`` (ViT's default: exact, erf-based);
    inference only."""

    has_backward = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if getattr(self.config, "hidden_act", "gelu") != "gelu":  # the kernel fuses exact GELU only
            return self.fc2(self.activation_fn(self.fc1(hidden_states)))
        return vit_mlp(hidden_states, self.fc1, self.fc2)


class ViTLayer(torch.nn.Module):
    """Forward of transformers' ``ViTLayer``: attention in torch (the module's own ``attention``), then
    ``layernorm_after`` + MLP + residual as one NKI kernel (``vit_ln_mlp_kernel``). Falls back to the module's
    math for a ``hidden_act`` other than ``"gelu"`` and in training mode (dropout); inference only."""

    has_backward = False

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.layernorm_before(hidden_states)
        hidden_states, _ = self.attention(hidden_states, attention_mask, **kwargs)
        hidden_states = self.dropout(hidden_states) + residual
        if self.training or getattr(self.mlp.config, "hidden_act", "gelu") != "gelu":
            return self.dropout(self.mlp(self.layernorm_after(hidden_states))) + hidden_states
        return vit_ln_mlp(hidden_states, self.layernorm_after, self.mlp.fc1, self.mlp.fc2)
