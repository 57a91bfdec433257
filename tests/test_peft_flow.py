"""PEFT LoRA on neuron: a tiny Llama (torch_neuronx.testing.tiny_models) gets a LoRA adapter, trains a few AdamW steps
on neuron, saves the adapter (save_pretrained), and the adapter loaded on CPU onto the same base model gives the
trained model's logits; merge_and_unload (on CPU and on neuron) gives them too.

Tolerance: fp32 logits within 1e-4 absolute (|logits| ~ 1): neuron and CPU kernels sum in different orders
(~1e-6 relative per matmul), and merging W + B@A * scale rounds differently from applying the adapter apart.
The training itself is compared with the same steps on CPU: losses within 1e-4 relative.
"""

import pytest
import torch

pytest.importorskip("peft")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

from torch_neuronx.testing.tiny_models import make_tiny_llama  # noqa: E402

ATOL = 1e-4


def lora_train(device, base_dir, steps=5):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).to(device)
    torch.manual_seed(0)  # LoRA A init
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "up_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, base.config.vocab_size, (2, 24), generator=g).to(device)
    losses = []
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    model.eval()
    return model, ids, losses


def test_lora_train_save_load_on_cpu_merge(tmp_path):
    from transformers import AutoModelForCausalLM

    base_dir = tmp_path / "base"
    make_tiny_llama(base_dir)
    model, ids, losses = lora_train("neuron", base_dir)
    _, _, cpu_losses = lora_train("cpu", base_dir)
    assert max(abs(a - b) / abs(b) for a, b in zip(losses, cpu_losses)) <= 1e-4, (losses, cpu_losses)
    assert losses[-1] < losses[0]
    with torch.no_grad():
        trained = model(input_ids=ids).logits.cpu()
    model.save_pretrained(tmp_path / "adapter")

    cpu_ids = ids.cpu()
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(input_ids=cpu_ids).logits
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        on_cpu = loaded(input_ids=cpu_ids).logits
        merged = loaded.merge_and_unload()(input_ids=cpu_ids).logits
    assert (trained - base_logits).abs().max() > 1e-2  # the adapter changed the model
    for name, got in [("adapter on CPU", on_cpu), ("merged on CPU", merged)]:
        diff = (got - trained).abs().max().item()
        print(f"{name}: max |logits - trained on neuron| {diff:.2e}")
        assert diff <= ATOL, (name, diff)

    merged_neuron = model.merge_and_unload()
    with torch.no_grad():
        got = merged_neuron(input_ids=ids).logits.cpu()
    assert next(merged_neuron.parameters()).device.type == "neuron"
    assert (got - trained).abs().max().item() <= ATOL
