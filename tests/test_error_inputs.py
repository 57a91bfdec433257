"""Bad input raises on neuron what it raises on CPU: every `error_inputs` entry of PyTorch's OpInfo database
(what PyTorch's own `test_errors` runs per device) that raises its named error on CPU raises the same error
type with a matching message on neuron. Among them: out= tensors that overlap an input or have the wrong
dtype, argument validation (gelu's `approximate`), and a CPU tensor mixed with neuron tensors
("Expected all tensors to be on the same device"; 0-dim CPU scalars stay allowed, as on CUDA)."""
import re
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import torch_neuronx  # noqa: F401

OPS = [op for op in op_db if op.error_inputs_func is not None]


def _raises(op, si, error_type, regex):
    """None when op(si) raises error_type matching regex, else what happened."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(si.input, *si.args, **si.kwargs)
    except error_type as e:
        return None if re.search(regex, str(e)) else f"message {str(e)[:200]!r} does not match {regex!r}"
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__}: {str(e)[:200]}"
    return "raised nothing"


@pytest.mark.parametrize("op", OPS, ids=lambda op: f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name)
def test_error_inputs_match_cpu(op):
    try:
        cpu_inputs = list(op.error_inputs(torch.device("cpu")))
        neuron_inputs = list(op.error_inputs(torch.device("neuron")))
    except Exception as e:  # noqa: BLE001 - a generator that cannot build its inputs for this device
        pytest.skip(f"error_inputs cannot be built: {type(e).__name__}: {e}")
    failures = []
    cpu_raises = [_raises(op, ei.sample_input, ei.error_type, ei.error_regex) is None for ei in cpu_inputs]
    if len(cpu_inputs) == len(neuron_inputs):
        pairs = [(ei, ok) for ei, ok in zip(neuron_inputs, cpu_raises)]
    else:  # CPU-only entries (bounds checks): match the others by their error
        expected = {(ei.error_type, ei.error_regex) for ei, ok in zip(cpu_inputs, cpu_raises) if ok}
        pairs = [(ei, (ei.error_type, ei.error_regex) in expected) for ei in neuron_inputs]
    for ei, cpu_ok in pairs:
        if not cpu_ok:
            continue  # CPU itself does not raise it (PyTorch's own expected failures)
        got = _raises(op, ei.sample_input, ei.error_type, ei.error_regex)
        if got is not None:
            failures.append(f"{ei.error_type.__name__}({ei.error_regex!r}): {got}")
    assert not failures, "\n".join(failures)
