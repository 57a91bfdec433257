import torch

from .. import vit_attention, vit_ln_mlp, vit_mlp


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


class ViTAttention(torch.nn.Module):
    """Forward of transformers' ``ViTAttention``: the module's q/k/v/o projections in torch, the attention itself
    (scores, softmax, weighted sum over all heads) as one NKI kernel (``vit_attention_kernel``). Returns
    ``(output, None)``: no attention weights. Falls back to eager math with an attention mask, in training mode
    (dropout), or beyond the kernel's limits (more than 512 tokens, head_dim over 128); inference only."""

    has_backward = False

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        if attention_mask is None and not self.training and hidden_states.dim() == 3 \
                and hidden_states.shape[1] <= 512 and self.head_dim <= 128:
            out = vit_attention(q, k, v, self.num_attention_heads, self.scaling)
            return self.o_proj(out), None
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        w = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        w = torch.nn.functional.dropout(w, p=self.attention_dropout, training=self.training)
        out = torch.matmul(w, v).transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)
        return self.o_proj(out), w
