"""relu-nki: an elementwise ReLU written as an NKI kernel (Hub layout, noarch ``build/torch-neuron`` variant).

``relu(x)`` takes a neuron tensor of any shape and returns a new one; the kernel streams the tensor through
SBUF in [128, <=2048] tiles (rows on the partitions) and applies ``max(x, 0)`` on the Vector Engine.
"""

import nki
import nki.isa as nisa
import nki.language as nl

__all__ = ["relu", "relu_kernel", "layers"]

_FREE = 2048  # columns per tile: 8 KiB per partition in fp32, well inside SBUF


@nki.jit(platform_target="trn2")
def relu_kernel(x):
    """max(x, 0) of a 2-D [rows, cols] HBM tensor, into a new HBM tensor of the same shape and dtype."""
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    P = nl.tile_size.pmax
    for r in nl.affine_range((rows + P - 1) // P):
        p = min(P, rows - r * P)
        for c in nl.affine_range((cols + _FREE - 1) // _FREE):
            f = min(_FREE, cols - c * _FREE)
            t = nl.ndarray((P, _FREE), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t[:p, :f], src=x[r * P:r * P + p, c * _FREE:c * _FREE + f])
            nisa.tensor_scalar(dst=t[:p, :f], data=t[:p, :f], op0=nl.maximum, operand0=0.0)
            nisa.dma_copy(dst=out[r * P:r * P + p, c * _FREE:c * _FREE + f], src=t[:p, :f])
    return out


def relu(x):
    """ReLU of a neuron (or CPU) tensor of any shape: the kernel runs on a [rows, last dim] view."""
    if x.dim() == 0 or x.numel() == 0:
        return x.clamp_min(0)
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    return relu_kernel(x2).reshape(x.shape)


from . import layers  # noqa: E402
