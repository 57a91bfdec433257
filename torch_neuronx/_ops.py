"""Per-operator call counters: how often each ATen operator ran a native neuron kernel and how often
it ran PyTorch's CPU kernel through the zero-copy fallback.

Set ``TORCH_NEURONX_DISABLE_FALLBACK=1`` to make every fallback an error instead.
"""

from typing import Dict

from . import _C


def op_counts() -> Dict[str, Dict[str, int]]:
    """``{"aten::add.Tensor": {"native": 0, "fallback": 12}, ...}`` since start or the last reset."""
    return {op: {"native": n, "fallback": f} for op, (n, f) in _C._op_counts().items() if n or f}


def reset_op_counts() -> None:
    _C._reset_op_counts()


def fallback_ops() -> Dict[str, int]:
    """Operators that ran on the CPU fallback, with their call counts, most frequent first."""
    items = [(op, c["fallback"]) for op, c in op_counts().items() if c["fallback"]]
    return dict(sorted(items, key=lambda kv: -kv[1]))
