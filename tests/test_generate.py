"""Generation with Transformers on neuron: device_map="neuron", greedy tokens equal CPU."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from torch_neuronx.testing.tiny_models import make_tiny_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_llama(str(d))
    return str(d)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_tokens_equal_cpu(model_dir, cache):
    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = tok.apply_chat_template([{"role": "user", "content": "The future of AI is"}], add_generation_prompt=True,
                                  return_tensors="pt")
    outs = {}
    for dev in ("cpu", "neuron"):
        model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=dev).eval()
        assert next(model.parameters()).device.type == dev
        kwargs = {"cache_implementation": "static"} if cache == "static" else {}
        # disable_compile: static-cache generation would otherwise compile (torch.compile support is separate work)
        outs[dev] = model.generate(**enc.to(dev), max_new_tokens=12, do_sample=False, disable_compile=True,
                                   **kwargs).cpu()
    assert torch.equal(outs["neuron"], outs["cpu"])


def test_static_cache_auto_compiles_on_neuron(model_dir):
    """Transformers compiles generate() on neuron with a static cache (backend "neuron", static shapes)."""
    import torch_neuronx.compiler as compiler

    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = tok.apply_chat_template([{"role": "user", "content": "The future of AI is"}], add_generation_prompt=True,
                                  return_tensors="pt")
    cpu = AutoModelForCausalLM.from_pretrained(model_dir, device_map="cpu").eval()
    ref = cpu.generate(**enc, max_new_tokens=8, do_sample=False, disable_compile=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map="neuron").eval()
    torch._dynamo.reset()
    compiler.reset_stats()
    out = model.generate(**enc.to("neuron"), max_new_tokens=8, do_sample=False, cache_implementation="static")
    assert torch.equal(out.cpu(), ref)
    s = compiler.stats()
    assert len(s["graphs"]) == 1 and s["recompiles"] == []  # compiled once, not per token
