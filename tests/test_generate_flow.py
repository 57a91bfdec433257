"""The single-device flow a Transformers user runs, on neuron, compared with the same run on CPU.

    model = AutoModelForCausalLM.from_pretrained(path, dtype=..., device_map="neuron").eval()
    inputs = tok.apply_chat_template(..., padding=True, tokenizer_kwargs={"pad_to_multiple_of": 512}, ...)
    model.generate(inputs["input_ids"], attention_mask=..., generation_config=GenerationConfig(static cache...))

Tiny local Llama and Qwen3 models (fitted briefly to a built-in text, so greedy margins are large),
float32 and bfloat16, batch 1 and a left-padded batch of 4. Static-cache generation uses Transformers'
defaults (torch.compile with the "neuron" backend) when that dynamo backend is registered, and
``disable_compile=True`` otherwise.
"""

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from torch_neuronx.testing.tiny_models import make_tiny_llama

PROMPTS = ["The future of AI is", "A language model reads text", "The weather was mild in the spring, and the",
           "Good software"]


def compile_available():
    try:
        return "neuron" in torch._dynamo.list_backends(exclude_tags=())
    except Exception:
        return False


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model_dir(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"tiny-{request.param}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the fit is tiny: thread synchronisation would cost more than it saves
    try:
        make_tiny_llama(str(d), model_type=request.param, train_steps=60)
    finally:
        torch.set_num_threads(threads)
    return str(d)


def chat_inputs(tok, n):
    tok.pad_token = tok.pad_token or tok.eos_token
    tok.padding_side = "left"
    chats = [[{"role": "user", "content": p}] for p in PROMPTS[:n]]
    return tok.apply_chat_template(chats, add_generation_prompt=True, padding=True,
                                   tokenizer_kwargs={"pad_to_multiple_of": 512}, return_tensors="pt")


def flow_config(tok, max_new_tokens, **kw):
    args = dict(max_new_tokens=max_new_tokens, do_sample=False, use_cache=True, pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id, cache_implementation="static", max_cache_len=1024, prefill_chunk_size=512)
    cfg = GenerationConfig(**{**args, **kw})
    if not compile_available():
        cfg.disable_compile = True
    return cfg


def run_flow(path, device, dtype, batch, max_new_tokens, **kw):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    inputs = chat_inputs(tok, batch)
    cfg = flow_config(tok, max_new_tokens, **kw)
    dev = next(model.parameters()).device
    assert dev.type == torch.device(device).type and next(model.parameters()).dtype == dtype
    out = model.generate(inputs["input_ids"].to(dev), attention_mask=inputs["attention_mask"].to(dev),
                         generation_config=cfg)
    return out.cpu(), inputs


def next_logits(path, device, dtype, ids, mask):
    """float32 logits of the token after `ids` (one row) from a fresh model in `dtype` on `device`."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device).eval()
    with torch.no_grad():
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device))
    return out.logits[0, -1].float().cpu()


def assert_same_or_bf16_near_tie(path, neuron, cpu, prompt_mask, dtype):
    """Greedy tokens must be identical. In bfloat16 two correct backends may still part at a near-tie: each
    rounds its logits differently (another summation order), so where the float32 logits of the two chosen
    tokens are closer than the two runs' own bfloat16 errors, either choice is right (run A picks a, run B
    picks b, each within e_A, e_B of the float32 logits l: |l[a] - l[b]| <= e_A + e_B). A real bug shows as
    an error far beyond bfloat16 rounding; the errors are also bounded here (0.1 for these small logits)."""
    if torch.equal(neuron, cpu):
        return
    assert dtype == torch.bfloat16 and neuron.shape == cpu.shape, "float32 greedy tokens differ from CPU"
    rows = [r for r in range(neuron.shape[0]) if not torch.equal(neuron[r], cpu[r])]
    for row in rows:
        pos = int((neuron[row] != cpu[row]).nonzero()[0])
        ids = neuron[row : row + 1, :pos]
        mask = torch.cat([prompt_mask[row : row + 1], torch.ones(1, pos - prompt_mask.shape[1], dtype=torch.long)], 1)
        exact = next_logits(path, "cpu", torch.float32, ids, mask)
        err = {d: (next_logits(path, d, dtype, ids, mask) - exact).abs().max().item() for d in ("neuron", "cpu")}
        a, b = int(neuron[row, pos]), int(cpu[row, pos])
        gap = abs(exact[a] - exact[b]).item()
        assert gap <= err["neuron"] + err["cpu"] and max(err.values()) < 0.1, (row, pos, a, b, gap, err)


# fp32 at batch 1 and bf16 at batch 4 by default; the other two pairs in long mode.
@pytest.mark.parametrize("dtype,batch", [(torch.float32, 1), (torch.bfloat16, 4),
                                         pytest.param(torch.float32, 4, marks=pytest.mark.slow),
                                         pytest.param(torch.bfloat16, 1, marks=pytest.mark.slow)],
                         ids=["fp32-1", "bf16-4", "fp32-4", "bf16-1"])
def test_static_flow_greedy_equals_cpu(model_dir, dtype, batch):
    # The full flow (128 new tokens) once, shorter runs for the other combinations.
    new = 128 if (dtype, batch) == (torch.bfloat16, 4) and "llama" in model_dir else 24
    neuron, inputs = run_flow(model_dir, "neuron", dtype, batch, new)
    cpu, _ = run_flow(model_dir, "cpu", dtype, batch, new)
    assert inputs["input_ids"].shape == (batch, 512)
    assert (inputs["attention_mask"][:, 0] == 0).all(), "prompts are left-padded"
    assert neuron.shape == cpu.shape
    assert_same_or_bf16_near_tie(model_dir, neuron, cpu, inputs["attention_mask"], dtype)


def test_sampling_reproducible_under_manual_seed(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map="neuron").eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    inputs = chat_inputs(tok, 4).to("neuron")
    cfg = flow_config(tok, 8, do_sample=True, temperature=1.5, top_k=0)
    runs = []
    for seed in (123, 123, 7):
        torch.manual_seed(seed)
        runs.append(model.generate(**inputs, generation_config=cfg).cpu())
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2]), "a different seed should sample different tokens"


def test_default_dynamic_cache_without_config(model_dir):
    outs = {}
    for dev in ("cpu", "neuron"):
        model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=dev).eval()
        tok = AutoTokenizer.from_pretrained(model_dir)
        inputs = tok.apply_chat_template([[{"role": "user", "content": p}] for p in PROMPTS], add_generation_prompt=True,
                                         padding=True, return_tensors="pt")
        outs[dev] = model.generate(**inputs.to(dev)).cpu()
    assert outs["neuron"].shape[1] > inputs["input_ids"].shape[1]
    assert torch.equal(outs["neuron"], outs["cpu"])


def test_to_neuron_after_cpu_load(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    inputs = chat_inputs(tok, 4)
    cfg = flow_config(tok, 8)
    cpu = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], generation_config=cfg)
    model.to("neuron")
    assert all(p.device.type == "neuron" for p in model.parameters())
    inputs = inputs.to("neuron")
    neuron = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], generation_config=cfg)
    assert torch.equal(neuron.cpu(), cpu)


@pytest.mark.parametrize("async_load", [True, False], ids=["threaded", "HF_DEACTIVATE_ASYNC_LOAD=1"])
def test_threaded_weight_loading(model_dir, monkeypatch, async_load):
    import transformers.core_model_loading as cml

    pools = []

    class CountingPool(cml.ThreadPoolExecutor):
        def __init__(self, *a, **k):
            pools.append(self)
            super().__init__(*a, **k)

        def submit(self, *a, **k):
            self.threads_used = True
            return super().submit(*a, **k)

    monkeypatch.setattr(cml, "ThreadPoolExecutor", CountingPool)
    if async_load:
        monkeypatch.delenv("HF_DEACTIVATE_ASYNC_LOAD", raising=False)
    else:
        monkeypatch.setenv("HF_DEACTIVATE_ASYNC_LOAD", "1")
    ref = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    pools.clear()
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map="neuron")
    assert bool(pools and getattr(pools[0], "threads_used", False)) == async_load
    state = model.state_dict()
    assert state.keys() == ref.keys()
    for k, v in state.items():
        assert v.device.type == "neuron", k
        assert torch.equal(v.cpu(), ref[k]), k


def test_caching_allocator_warmup(tmp_path, monkeypatch):
    """Loading calls transformers' caching_allocator_warmup for the neuron device map. Transformers 5.x skips the
    warm-up allocation on neuron; the allocation it makes on other accelerators (one block the size of the model,
    freed at once) must make the load reuse that cached block: no new large segment while the weights land."""
    import transformers.modeling_utils as mu

    # Large enough that the weight matrices are served by the large pool (> 1 MiB each).
    make_tiny_llama(str(tmp_path), hidden_size=512, intermediate=1024, heads=8, kv_heads=4, layers=2)
    calls = []
    real = mu.caching_allocator_warmup

    def spy(model, expanded_device_map, hf_quantizer):
        before = torch.neuron.memory_stats(0)["allocation.all.allocated"]
        real(model, expanded_device_map, hf_quantizer)
        calls.append((set(map(str, expanded_device_map.values())),
                      torch.neuron.memory_stats(0)["allocation.all.allocated"] - before))

    monkeypatch.setattr(mu, "caching_allocator_warmup", spy)
    torch.neuron.empty_cache()
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), device_map="neuron:0")
    assert calls and calls[0][0] == {"neuron:0"}
    assert calls[0][1] in (0, 1), "the warm-up makes at most one allocation"
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model

    # The warm-up as done for CUDA: one allocation of the model's size (float16 elements), freed at once.
    monkeypatch.setattr(mu, "caching_allocator_warmup", real)
    torch.neuron.empty_cache()
    stats0 = torch.neuron.memory_stats(0)
    torch.empty(model_bytes // 2, dtype=torch.float16, device="neuron:0")
    stats1 = torch.neuron.memory_stats(0)
    assert stats1["allocation.all.allocated"] - stats0["allocation.all.allocated"] == 1
    assert stats1["segment.large_pool.allocated"] - stats0["segment.large_pool.allocated"] == 1
    assert stats1["reserved_bytes.large_pool.current"] >= model_bytes
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), device_map="neuron:0")
    stats2 = torch.neuron.memory_stats(0)
    assert stats2["segment.large_pool.allocated"] == stats1["segment.large_pool.allocated"], \
        "large weights must be carved out of the warmed-up block"
    assert stats2["reserved_bytes.large_pool.current"] == stats1["reserved_bytes.large_pool.current"]
    assert stats2["allocated_bytes.all.current"] >= model_bytes
    del model


def test_device_map_second_device(model_dir):
    assert torch.neuron.device_count() >= 2
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map={"": "neuron:1"}).eval()
    assert {p.device for p in model.parameters()} == {torch.device("neuron:1")}
    tok = AutoTokenizer.from_pretrained(model_dir)
    inputs = chat_inputs(tok, 4)
    cfg = flow_config(tok, 8)
    # Count allocations, not bytes: an earlier test's garbage on neuron:0 may be collected during generate.
    before0 = torch.neuron.memory_stats(0)["allocation.all.allocated"]
    out = model.generate(inputs["input_ids"].to("neuron:1"), attention_mask=inputs["attention_mask"].to("neuron:1"),
                         generation_config=cfg)
    assert out.device == torch.device("neuron:1")
    assert torch.neuron.memory_stats(0)["allocation.all.allocated"] == before0, "nothing may land on neuron:0"
    cpu_model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ref = cpu_model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], generation_config=cfg)
    assert torch.equal(out.cpu(), ref)
