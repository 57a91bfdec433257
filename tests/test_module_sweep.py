"""PyTorch's module database on neuron (torch_neuronx.tools.module_sweep): every non-lazy `module_db` entry,
forward and backward (input and parameter gradients), training and eval, each module input as built and
in channels-last, equals CPU. The whole sweep takes about 20 s, so CI runs all of it."""
import pytest

pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest (in requirements.txt)")

from torch_neuronx.tools import module_sweep as sweep  # noqa: E402

INFOS = sweep.load_module_db()


@pytest.mark.parametrize("info", INFOS, ids=lambda m: m.name)
def test_module_matches_cpu(info):
    records = list(sweep.run_module(info, max_inputs=6))
    bad = [f"{r['dtype']} {r['mode']} input {r['input']} {r['form']}: {r['status']}: {r['msg']}"
           for r in records if r["status"] in ("mismatch", "error")]
    assert not bad, f"{info.name}: {len(bad)} of {len(records)} differ from CPU:\n" + "\n".join(bad[:8])
    assert any(r["status"] == "pass" for r in records), f"{info.name}: nothing compared"


def test_sweep_detects_a_difference(monkeypatch):
    """The comparison is live: a module whose neuron copy computes something else is reported."""
    import torch

    info = next(m for m in INFOS if m.name == "nn.Linear")
    real = torch.nn.Linear.forward

    def skewed(self, x):
        out = real(self, x)
        return out + 1e-3 if out.device.type == "neuron" else out

    monkeypatch.setattr(torch.nn.Linear, "forward", skewed)
    statuses = {r["status"] for r in sweep.run_module(info, dtypes=("float32",), max_inputs=2)}
    assert "mismatch" in statuses
