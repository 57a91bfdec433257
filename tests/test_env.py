"""Logical core selection from the environment, read once at start (hence subprocesses)."""
import pytest

COUNT = "import torch, torch_neuronx; print(torch.neuron.device_count(), " \
        "[torch.neuron.get_device_properties(i).physical_index for i in range(torch.neuron.device_count())])"


@pytest.mark.parametrize("env,expected", [
    ({}, "4 [0, 1, 2, 3]"),
    ({"NEURON_LOGICAL_NC_CONFIG": "1"}, "8 [0, 1, 2, 3, 4, 5, 6, 7]"),
    ({"NEURON_RT_VISIBLE_CORES": "1-2"}, "2 [1, 2]"),
    ({"NEURON_RT_VISIBLE_CORES": "0,3"}, "2 [0, 3]"),
    ({"NEURON_RT_NUM_CORES": "3"}, "3 [0, 1, 2]"),
    ({"NEURON_RT_VISIBLE_CORES": "3", "NEURON_RT_NUM_CORES": "2"}, "1 [3]"),
])
def test_core_selection(python, env, expected):
    r = python(COUNT, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == expected


@pytest.mark.parametrize("env,match", [
    ({"NEURON_RT_VISIBLE_CORES": "0-9"}, "NEURON_RT_VISIBLE_CORES"),
    ({"NEURON_RT_VISIBLE_CORES": "two"}, "NEURON_RT_VISIBLE_CORES"),
    ({"NEURON_RT_VISIBLE_CORES": "2-1"}, "NEURON_RT_VISIBLE_CORES"),
    ({"NEURON_RT_NUM_CORES": "0"}, "NEURON_RT_NUM_CORES"),
    ({"NEURON_LOGICAL_NC_CONFIG": "3"}, "NEURON_LOGICAL_NC_CONFIG"),
])
def test_bad_environment_fails_at_import(python, env, match):
    for code in ("import torch_neuronx", "import torch"):
        r = python(code, env=env)
        assert r.returncode != 0, (code, env)
        assert match in r.stderr, r.stderr
        assert "Segmentation" not in r.stderr


def test_visible_cores_renumbered_tensors(python):
    r = python("import torch; t = torch.ones(2, device='neuron:1'); print(t.device, "
               "torch.neuron.get_device_properties(1).physical_index)", env={"NEURON_RT_VISIBLE_CORES": "2-3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["neuron:1", "3"]
