"""The Hub-layout NKI kernel repos under examples/kernels/ (relu-nki, vit-mlp-nki), loaded by HF `kernels`
offline: get_local_kernel, LOCAL_KERNELS with revision="main", and kernelize(..., device="neuron",
mode=Mode.INFERENCE), including a tiny ViTForImageClassification whose MLP blocks run the fused NKI kernel."""

import json
from pathlib import Path

import pytest
import torch

import nki

kernels = pytest.importorskip("kernels")

ROOT = Path(__file__).resolve().parent.parent / "examples" / "kernels"
RELU = ROOT / "relu-nki"
VIT_MLP = ROOT / "vit-mlp-nki"
DEV = "neuron"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    orig = nki.Kernel.__call__

    def spy(self, *a, **k):
        calls.append(self.__name__)
        return orig(self, *a, **k)

    monkeypatch.setattr(nki.Kernel, "__call__", spy)
    return calls


@pytest.mark.parametrize("repo", [RELU, VIT_MLP])
def test_repo_layout_and_metadata(repo):
    variant = repo / "build" / "torch-neuron"
    for f in ("__init__.py", "layers/__init__.py", "metadata.json"):
        assert (variant / f).is_file(), f
    meta = json.loads((variant / "metadata.json").read_text())
    assert meta["python-depends"] == ["nki"] and meta["backend"]["type"] == "neuron"


def test_relu_get_local_kernel():
    mod = kernels.get_local_kernel(RELU)
    for shape, dtype in (((64, 96), torch.float32), ((3, 300, 2100), torch.float32), ((5, 7), torch.bfloat16)):
        x = torch.randn(shape, device=DEV).to(dtype)
        y = mod.relu(x)
        assert y.device.type == "neuron" and y.dtype == dtype and y.shape == x.shape
        assert torch.equal(y.cpu(), x.cpu().relu())
    x = torch.randn(16, 16, device=DEV)
    assert torch.equal(mod.layers.ReLU()(x).cpu(), x.cpu().relu())


def test_relu_local_kernels_override_and_kernelize(monkeypatch, kernel_calls):
    monkeypatch.setenv("LOCAL_KERNELS", f"torchneuron-examples/relu-nki={RELU}")
    relu = kernels.get_kernel("torchneuron-examples/relu-nki", revision="main")
    x = torch.randn(16, 16, dtype=torch.float16).to(DEV)
    torch.testing.assert_close(relu.relu(x), x.relu())

    @kernels.use_kernel_forward_from_hub("ReLU")
    class ReLU(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.relu(x)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(32, 32)
            self.act = ReLU()

        def forward(self, x):
            return self.act(self.linear(x))

    model = Model().to(DEV).eval()
    X = torch.randn(8, 32, device=DEV)
    ref = model(X)
    mapping = {"ReLU": {"neuron": kernels.LayerRepository(repo_id="torchneuron-examples/relu-nki", revision="main",
                                                          layer_name="ReLU")}}
    with kernels.use_kernel_mapping(mapping):
        model = kernels.kernelize(model, device="neuron", mode=kernels.Mode.INFERENCE)
    kernel_calls.clear()
    out = model(X)
    assert kernel_calls == ["relu_kernel"]
    assert out.device.type == "neuron"
    torch.testing.assert_close(out, ref)


def _tiny_vit(**overrides):
    from transformers import ViTConfig, ViTForImageClassification

    cfg = dict(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=160, num_labels=5, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0)
    cfg.update(overrides)
    torch.manual_seed(0)
    return ViTForImageClassification(ViTConfig(**cfg)).eval()


@pytest.fixture
def tagged_vit_mlp():
    """ViT (transformers 5.23) tags no module for Hub kernels: tag ViTMLP for this test, then untag it."""
    from transformers.models.vit.modeling_vit import ViTMLP

    kernels.replace_kernel_forward_from_hub(ViTMLP, "ViTMLP")
    yield ViTMLP
    for attr in ("kernel_layer_name", "kernel_condition"):
        if attr in ViTMLP.__dict__:
            delattr(ViTMLP, attr)


def test_vit_mlp_kernel_direct_on_odd_sizes():
    mod = kernels.get_local_kernel(VIT_MLP)
    torch.manual_seed(1)
    fc1, fc2 = torch.nn.Linear(160, 300).to(DEV), torch.nn.Linear(300, 160).to(DEV)
    x = torch.randn(3, 190, 160, device=DEV)  # 570 tokens: two token blocks; 160 / 300 features: partial tiles
    with torch.no_grad():
        ref = fc2(torch.nn.functional.gelu(fc1(x)))
        out = mod.vit_mlp(x, fc1, fc2)
    assert out.shape == ref.shape and out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)


def test_vit_kernelize_equals_eager(tagged_vit_mlp, kernel_calls, monkeypatch):
    model = _tiny_vit().to(DEV)
    torch.manual_seed(2)
    pixels = torch.randn(2, 3, 32, 32, device=DEV)
    with torch.no_grad():
        ref = model(pixel_values=pixels).logits
    monkeypatch.setenv("LOCAL_KERNELS", f"kernels-community/vit-mlp-nki={VIT_MLP}")
    mapping = {"ViTMLP": {"neuron": kernels.LayerRepository(repo_id="kernels-community/vit-mlp-nki",
                                                            revision="main", layer_name="ViTMLP")}}
    with kernels.use_kernel_mapping(mapping):
        model = kernels.kernelize(model, device="neuron", mode=kernels.Mode.INFERENCE)
    kernel_calls.clear()
    with torch.no_grad():
        out = model(pixel_values=pixels).logits
    assert kernel_calls == ["vit_mlp_kernel"] * 2  # one per encoder layer
    assert out.device.type == "neuron" and out.shape == (2, 5)
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)


def test_vit_kernelize_local_layer_repository_bf16(tagged_vit_mlp, kernel_calls):
    model = _tiny_vit().to(DEV, torch.bfloat16)
    pixels = torch.randn(1, 3, 32, 32, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = model(pixel_values=pixels).logits.float()
    mapping = {"ViTMLP": {"neuron": kernels.LocalLayerRepository(repo_path=VIT_MLP, layer_name="ViTMLP")}}
    with kernels.use_kernel_mapping(mapping):
        model = kernels.kernelize(model, device="neuron", mode=kernels.Mode.INFERENCE)
    kernel_calls.clear()
    with torch.no_grad():
        out = model(pixel_values=pixels).logits.float()
    assert kernel_calls == ["vit_mlp_kernel"] * 2
    # bf16: the kernel keeps fc1's result in fp32 PSUM and rounds once after GELU, eager rounds after each op
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=5e-2, atol=5e-2)


def test_relu_kernelize_training_backward_through_nki_op(kernel_calls):
    """relu-nki's layer goes through torch_neuronx.nki_op custom ops with register_autograd: Mode.TRAINING."""
    mapping = {"ReLUTrain": {"neuron": kernels.LocalLayerRepository(repo_path=RELU, layer_name="ReLU")}}

    @kernels.use_kernel_forward_from_hub("ReLUTrain")
    class ReLU(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.relu(x)

    torch.manual_seed(3)
    lin = torch.nn.Linear(24, 40)
    model = torch.nn.Sequential(lin, ReLU()).to(DEV)
    x = torch.randn(50, 24)
    ref_model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.ReLU())
    ref_model.load_state_dict(model.state_dict())
    ref_model(x).square().sum().backward()
    with kernels.use_kernel_mapping(mapping):
        model = kernels.kernelize(model, device="neuron", mode=kernels.Mode.TRAINING)
    kernel_calls.clear()
    model(x.to(DEV)).square().sum().backward()
    assert kernel_calls == ["relu_kernel", "relu_backward_kernel"]
    torch.testing.assert_close(lin.weight.grad.cpu(), ref_model[0].weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lin.bias.grad.cpu(), ref_model[0].bias.grad, rtol=1e-5, atol=1e-5)


@pytest.fixture
def tagged_vit_layer():
    from transformers.models.vit.modeling_vit import ViTLayer

    kernels.replace_kernel_forward_from_hub(ViTLayer, "ViTLayer")
    yield ViTLayer
    for attr in ("kernel_layer_name", "kernel_condition"):
        if attr in ViTLayer.__dict__:
            delattr(ViTLayer, attr)


def test_vit_layer_layernorm_mlp_residual_fused_equals_eager(tagged_vit_layer, kernel_calls):
    """The ViTLayer layer: attention in torch, then LayerNorm + MLP + residual in one NKI kernel."""
    model = _tiny_vit(layer_norm_eps=1e-12).to(DEV)
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for layer in model.vit.layers:
            layer.layernorm_after.weight.normal_()
            layer.layernorm_after.bias.normal_()
    pixels = torch.randn(3, 3, 32, 32, device=DEV)
    with torch.no_grad():
        ref = model(pixel_values=pixels).logits
    mapping = {"ViTLayer": {"neuron": kernels.LocalLayerRepository(repo_path=VIT_MLP, layer_name="ViTLayer")}}
    with kernels.use_kernel_mapping(mapping):
        model = kernels.kernelize(model, device="neuron", mode=kernels.Mode.INFERENCE)
    kernel_calls.clear()
    with torch.no_grad():
        out = model(pixel_values=pixels).logits
    assert kernel_calls == ["vit_ln_mlp_kernel"] * 2
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)


def test_vit_attention_and_layer_kernels_together_equal_eager(tagged_vit_layer, kernel_calls):
    """ViTAttention (fused attention) and ViTLayer (LayerNorm + MLP + residual) layers together: every encoder
    op but the q/k/v/o projections and layernorm_before runs in NKI kernels."""
    from transformers.models.vit.modeling_vit import ViTAttention

    kernels.replace_kernel_forward_from_hub(ViTAttention, "ViTAttention")
    try:
        model = _tiny_vit(image_size=48).to(DEV)  # 37 tokens
        pixels = torch.randn(2, 3, 48, 48, device=DEV)
        with torch.no_grad():
            ref = model(pixel_values=pixels).logits
        repo = {"neuron": kernels.LocalLayerRepository(repo_path=VIT_MLP, layer_name="ViTLayer")}
        mapping = {"ViTLayer": repo,
                   "ViTAttention": {"neuron": kernels.LocalLayerRepository(repo_path=VIT_MLP,
                                                                           layer_name="ViTAttention")}}
        with kernels.use_kernel_mapping(mapping):
            model = kernels.kernelize(model, device="neuron", mode=kernels.Mode.INFERENCE)
        kernel_calls.clear()
        with torch.no_grad():
            out = model(pixel_values=pixels).logits
        assert sorted(kernel_calls) == ["vit_attention_kernel"] * 2 + ["vit_ln_mlp_kernel"] * 2
        torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)
    finally:
        for attr in ("kernel_layer_name", "kernel_condition"):
            if attr in ViTAttention.__dict__:
                delattr(ViTAttention, attr)
