"""CI subset of the causal-LM architecture sweep (python -m torch_neuronx.tools.arch_sweep runs them all).

Each architecture: a tiny random model, greedy generation of 16 tokens with the dynamic and the static
cache on CPU and on neuron from the same weights; tokens identical, per-step logits within fp32 tolerance.
"""
import pytest

from torch_neuronx.tools.arch_sweep import run_arch

POPULAR = ["llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "mixtral", "gemma2", "gemma3_text", "phi3", "gpt2",
           "gpt_neox", "falcon", "olmo2", "deepseek_v3", "gpt_oss"]


@pytest.mark.parametrize("model_type", POPULAR)
def test_architecture_generates_like_cpu(model_type):
    res = run_arch(model_type)
    modes = res.get("modes", {})
    detail = {c: (m.get("status"), m.get("reason"), (m.get("traceback") or "")[-800:]) for c, m in modes.items()}
    assert res["status"] == "PASS", f"{model_type}: {res['status']}: {res.get('reason')}\n{detail}"
    # Both caches ran on the full (left-padded) batch: nothing was skipped on CPU.
    assert {c: m.get("status") for c, m in modes.items()} == {"dynamic": "PASS", "static": "PASS"}, detail
    assert all(m.get("batch") == "padded" for m in modes.values()), detail
