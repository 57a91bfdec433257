"""TorchNeuron: the ``neuron`` device for PyTorch.

``import torch`` loads this package through the ``torch.backends`` entry point (set
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` to disable that); ``import torch_neuronx`` loads it explicitly.
Afterwards ``torch.device("neuron")``, ``tensor.to("neuron")``, ``torch.neuron`` and
``torch.accelerator`` work as they do for other PyTorch devices.
"""

__version__ = "0.1.0"


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group, called by ``import torch``."""
    from ._backend import load

    load()


def _cli_mode() -> bool:
    """`python -m torch_neuronx`, `neuron-ls`, `neuron-top`: they report a broken set-up (extension not
    built, torch mismatch, bad NEURON_RT_*), so importing the package must not load the extension first."""
    import os
    import sys

    orig = list(getattr(sys, "orig_argv", []))
    if "-m" in orig and orig.index("-m") + 1 < len(orig):
        return orig[orig.index("-m") + 1] in ("torch_neuronx", "torch_neuronx.cli", "torch_neuronx.__main__")
    return bool(sys.argv) and os.path.basename(sys.argv[0]) in ("neuron-ls", "neuron-top")


__all__ = ["op_counts", "reset_op_counts", "fallback_ops", "__version__"]

if not _cli_mode():
    # Defined before `import torch`: when this package is imported first, torch's autoload calls back into it.
    import torch  # noqa: E402

    from ._backend import load as _load  # noqa: E402

    _load()

    from ._ops import fallback_ops, op_counts, reset_op_counts  # noqa: E402


def __getattr__(name):
    # Lazy: `import torch` (which autoloads this package) must not import nki/numpy kernels machinery.
    if name == "nki_op":
        from ._nki_op import nki_op

        return nki_op
    if name == "nki":
        import nki

        return nki
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
