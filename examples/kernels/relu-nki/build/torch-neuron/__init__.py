"""relu-nki: an elementwise ReLU written as an NKI kernel (Hub layout, noarch ``build/torch-neuron`` variant).

``relu(x)`` takes a neuron tensor of any shape and returns a new one; the kernel streams the tensor through
SBUF in [128, <=2048] tiles (rows on the partitions) and applies ``max(x, 0)`` on the Vector Engine.
"""

import nki
import nki.isa as nisa
import nki.language as nl

__all__ = ["relu", "relu_kernel", "relu_backward_kernel", "layers"]

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


@nki.jit(platform_target="trn2")
def relu_backward_kernel(grad, y):
    """grad * (y > 0) for 2-D [rows, cols] HBM tensors (y: the forward's output)."""
    rows, cols = y.shape
    out = nl.ndarray((rows, cols), dtype=grad.dtype, buffer=nl.shared_hbm)
    P = nl.tile_size.pmax
    for r in nl.affine_range((rows + P - 1) // P):
        p = min(P, rows - r * P)
        for c in nl.affine_range((cols + _FREE - 1) // _FREE):
            f = min(_FREE, cols - c * _FREE)
            g = nl.ndarray((P, _FREE), dtype=grad.dtype, buffer=nl.sbuf)
            t = nl.ndarray((P, _FREE), dtype=y.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=g[:p, :f], src=grad[r * P:r * P + p, c * _FREE:c * _FREE + f])
            nisa.dma_copy(dst=t[:p, :f], src=y[r * P:r * P + p, c * _FREE:c * _FREE + f])
            nisa.tensor_scalar(dst=t[:p, :f], data=t[:p, :f], op0=nl.greater, operand0=0.0)  # 1.0 / 0.0
            nisa.tensor_tensor(dst=g[:p, :f], data1=g[:p, :f], data2=t[:p, :f], op=nl.multiply)
            nisa.dma_copy(dst=out[r * P:r * P + p, c * _FREE:c * _FREE + f], src=g[:p, :f])
    return out


def _as_2d(x):
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


def _make_ops():
    """The kernels as torch custom ops (torch_neuronx.nki_op) with a backward, when torch_neuronx is there."""
    try:
        import torch_neuronx
    except ImportError:
        return None
    fwd = torch_neuronx.nki_op("relu_nki::relu", relu_kernel, output_like="x")
    bwd = torch_neuronx.nki_op("relu_nki::relu_backward", relu_backward_kernel, output_like="grad")

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return bwd(grad.contiguous(), y)

    fwd.register_autograd(backward, setup_context=setup_context)
    return fwd


_relu_op = _make_ops()


def relu(x):
    """ReLU of a neuron (or CPU) tensor of any shape: the kernel runs on a [rows, last dim] view. Differentiable
    (the backward is relu_backward_kernel) when torch_neuronx is importable."""
    if x.dim() == 0 or x.numel() == 0:
        return x.clamp_min(0)
    if _relu_op is not None:
        return _relu_op(_as_2d(x)).reshape(x.shape)
    return relu_kernel(_as_2d(x)).reshape(x.shape)


from . import layers  # noqa: E402
