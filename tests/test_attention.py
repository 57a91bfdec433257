"""scaled_dot_product_attention on neuron runs the fused C kernel and matches PyTorch CPU."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_neuronx

FUSED = "aten::_scaled_dot_product_fused_attention_overrideable"
FUSED_BWD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"
TOL = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (3e-2, 2e-2), torch.float16: (3e-3, 2e-3)}


def native_count(op):
    return torch_neuronx.op_counts().get(op, {}).get("native", 0)


def inputs(B, Hq, Hkv, Lq, Lk, D, dtype, Dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Lq, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Lk, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Lk, Dv or D, generator=g).to(dtype)
    return q, k, v


def cpu_ref(q, k, v, **kw):
    # float32 math reference: CPU bf16/fp16 kernels round intermediates, the neuron kernel does not.
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kw)


def check(out, ref, dtype):
    atol, rtol = TOL[dtype]
    assert out.device.type == "neuron" and out.dtype == dtype
    torch.testing.assert_close(out.cpu().float(), ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 4, 4, 37, 37, 64), (1, 8, 2, 70, 70, 80), (1, 4, 1, 1, 300, 128),
                                   (2, 2, 2, 5, 130, 96), (1, 2, 2, 66, 20, 32)])
@pytest.mark.parametrize("causal", [False, True])
def test_forward(dtype, shape, causal):
    B, Hq, Hkv, Lq, Lk, D = shape
    q, k, v = inputs(B, Hq, Hkv, Lq, Lk, D, dtype)
    gqa = Hq != Hkv
    before = native_count(FUSED)
    out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), is_causal=causal,
                                         enable_gqa=gqa)
    assert native_count(FUSED) == before + 1
    check(out, cpu_ref(q, k, v, is_causal=causal, enable_gqa=gqa), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kt_layout", ["contiguous", "transposed"])
def test_forward_several_query_and_key_blocks(dtype, causal, kt_layout):
    # Keys are transposed once per call for every 64-query block: 3 query blocks (the last partial), key
    # blocks of 64 with a partial last one, causality cutting blocks short, GQA, D not a multiple of 16, and
    # keys read through strides.
    B, Hq, Hkv, Lq, Lk, D = 2, 4, 2, 150, 200, 72
    q, k, v = inputs(B, Hq, Hkv, Lq, Lk, D, dtype)
    kn = k.to("neuron")
    if kt_layout == "transposed":
        kn = kn.transpose(2, 3).contiguous().transpose(2, 3)
    out = F.scaled_dot_product_attention(q.to("neuron"), kn, v.to("neuron"), is_causal=causal, enable_gqa=True)
    check(out, cpu_ref(q, k, v, is_causal=causal, enable_gqa=True), dtype)


@pytest.mark.parametrize("D", [1, 8, 20, 40, 72, 80, 512])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_head_dims(D, causal):
    # Head dims that are not a multiple of 16 run 8-wide strips and contract over D only on AVX2; 150 queries
    # and 140 keys cross block edges; Dv = D + 8 unless D is wide.
    q, k, v = inputs(1, 2, 1, 150, 140, D, torch.float32, Dv=D if D >= 80 else D + 8)
    out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), is_causal=causal,
                                         enable_gqa=True)
    check(out, cpu_ref(q, k, v, is_causal=causal, enable_gqa=True), torch.float32)


@pytest.mark.parametrize("where", ["q", "k", "k_masked_row"])
def test_nan_propagates_as_on_cpu(where):
    # A NaN score makes its row's maximum NaN: the whole row is NaN on CPU, and was zeros here when the NaN sat
    # in a row's first key block.
    q, k, v = inputs(1, 2, 2, 100, 100, 40, torch.float32)
    mask = None
    if where == "q":
        q[0, 0, 5, 3] = float("nan")
    else:
        k[0, 1, 3, 0] = float("nan")
    if where == "k_masked_row":
        mask = torch.zeros(100, 100)
        mask[7, :] = float("-inf")
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"),
                                         attn_mask=None if mask is None else mask.to("neuron")).cpu()
    assert torch.equal(out.isnan(), ref.isnan())
    torch.testing.assert_close(out.nan_to_num(), ref.nan_to_num(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("mask_kind", ["bool_full", "bool_bcast", "float_2d", "float_bcast_head", "float_view"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masks(mask_kind, dtype):
    B, H, Lq, Lk, D = 2, 3, 17, 45, 64
    q, k, v = inputs(B, H, H, Lq, Lk, D, dtype)
    g = torch.Generator().manual_seed(1)
    if mask_kind == "bool_full":
        m = torch.rand(B, H, Lq, Lk, generator=g) > 0.3
        m[0, 0, 3] = False  # a fully masked row gives zeros, as on the CPU
    elif mask_kind == "bool_bcast":
        m = torch.rand(B, 1, 1, Lk, generator=g) > 0.5
    elif mask_kind == "float_2d":
        m = torch.randn(Lq, Lk, generator=g).to(dtype)
        m[:, ::3] = float("-inf")
    elif mask_kind == "float_bcast_head":
        m = torch.randn(B, 1, Lq, Lk, generator=g).to(dtype)
    else:  # non-contiguous view
        m = torch.randn(B, H, Lk, Lq, generator=g).to(dtype).transpose(-1, -2)
    before = native_count(FUSED)
    out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), attn_mask=m.to("neuron"))
    assert native_count(FUSED) == before + 1
    mf = m if m.dtype == torch.bool else m.float()
    check(out, cpu_ref(q, k, v, attn_mask=mf), dtype)


def test_scale_and_value_dim():
    q, k, v = inputs(1, 2, 2, 9, 11, 48, torch.float32, Dv=24)
    out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), scale=0.37)
    check(out, cpu_ref(q, k, v, scale=0.37), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["causal_gqa", "float_mask", "plain_80"])
def test_backward(dtype, case):
    if case == "causal_gqa":
        q, k, v = inputs(1, 4, 2, 70, 70, 64, dtype)
        kw = dict(is_causal=True, enable_gqa=True)
    elif case == "float_mask":
        q, k, v = inputs(2, 2, 2, 13, 33, 32, dtype)
        kw = dict(attn_mask=torch.randn(13, 33).to(dtype))
    else:
        q, k, v = inputs(1, 3, 3, 40, 50, 80, dtype)
        kw = {}
    g = torch.randn(q.shape[:-1] + (v.shape[-1],)).to(dtype)
    ref = [t.detach().float().clone().requires_grad_() for t in (q, k, v)]
    cpu_kw = {a: (b.float() if isinstance(b, torch.Tensor) else b) for a, b in kw.items()}
    with sdpa_kernel(SDPBackend.MATH):
        F.scaled_dot_product_attention(*ref, **cpu_kw).backward(g.float())
    dev = [t.detach().to("neuron").requires_grad_() for t in (q, k, v)]
    dev_kw = {a: (b.to("neuron") if isinstance(b, torch.Tensor) else b) for a, b in kw.items()}
    before = native_count(FUSED_BWD)
    F.scaled_dot_product_attention(*dev, **dev_kw).backward(g.to("neuron"))
    assert native_count(FUSED_BWD) == before + 1
    atol, rtol = (1e-4, 1e-4) if dtype == torch.float32 else (5e-2, 5e-2)
    for d, r in zip(dev, ref):
        torch.testing.assert_close(d.grad.cpu().float(), r.grad, atol=atol, rtol=rtol)


def test_mask_gradient():
    q, k, v = inputs(1, 2, 2, 6, 9, 16, torch.float32)
    m = torch.randn(1, 1, 6, 9)
    mc = m.clone().requires_grad_()
    with sdpa_kernel(SDPBackend.MATH):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mc).sum().backward()
    mn = m.to("neuron").requires_grad_()
    F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), attn_mask=mn).sum().backward()
    torch.testing.assert_close(mn.grad.cpu(), mc.grad, atol=1e-5, rtol=1e-4)


def test_dropout_reproducible_and_p0():
    q, k, v = (t.to("neuron") for t in inputs(1, 2, 2, 20, 30, 32, torch.float32))
    torch.neuron.manual_seed(7)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4).cpu()
    torch.neuron.manual_seed(7)
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4).cpu()
    c = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4).cpu()
    assert torch.equal(a, b) and not torch.equal(a, c)
    full = F.scaled_dot_product_attention(q, k, v).cpu()
    assert not torch.allclose(a, full)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, dropout_p=0.0).cpu(), full)


def test_dropout_backward_uses_the_forward_mask():
    q, k, v = inputs(1, 1, 1, 8, 8, 16, torch.float32)
    dev = [t.detach().to("neuron").requires_grad_() for t in (q, k, v)]
    torch.neuron.manual_seed(3)
    out = F.scaled_dot_product_attention(*dev, dropout_p=0.5)
    out.backward(torch.ones_like(out))
    # out is linear in v: d(sum out)/dv[j] = sum_i P_drop[i, j]; recover P_drop from out with v = identity.
    torch.neuron.manual_seed(3)
    eye = torch.eye(8).reshape(1, 1, 8, 8).repeat(1, 1, 1, 2).to("neuron")
    pd = F.scaled_dot_product_attention(dev[0].detach(), dev[1].detach(), eye, dropout_p=0.5).cpu()[..., :8]
    torch.testing.assert_close(dev[2].grad.cpu(), pd.sum(-2, keepdim=True).transpose(-1, -2).expand(1, 1, 8, 16),
                               atol=1e-5, rtol=1e-5)


def test_zero_size():
    for shape in [(0, 2, 2, 4, 4, 8), (1, 2, 2, 0, 4, 8), (1, 2, 2, 3, 0, 8)]:
        B, Hq, Hkv, Lq, Lk, D = shape
        q, k, v = inputs(B, Hq, Hkv, Lq, Lk, D, torch.float32)
        out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"))
        assert out.shape == (B, Hq, Lq, D)
        torch.testing.assert_close(out.cpu(), cpu_ref(q, k, v))


def test_unsupported_goes_to_math():
    q, k, v = inputs(1, 2, 2, 5, 6, 8, torch.float64)
    out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"))
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v))
    q, k, v = inputs(1, 4, 2, 5, 6, 8, torch.float32)
    with pytest.raises(RuntimeError):  # GQA shapes without enable_gqa: PyTorch's error
        F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"))
    with pytest.raises(RuntimeError):  # mask and is_causal together
        F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), enable_gqa=True,
                                       is_causal=True, attn_mask=torch.ones(5, 6, dtype=torch.bool, device="neuron"))
    with sdpa_kernel(SDPBackend.MATH):  # the user's backend choice is honoured
        before = native_count(FUSED)
        F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), enable_gqa=True)
        assert native_count(FUSED) == before


def test_hf_llama_attention_is_fused():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        ref = model(ids).logits
        model.to("neuron")
        for cache in ("dynamic", "static"):
            before = native_count(FUSED)
            out = model.generate(ids.to("neuron"), max_new_tokens=3, do_sample=False, cache_implementation=cache,
                                 disable_compile=True)
            assert native_count(FUSED) >= before + 3 * 2, cache
            assert out.shape == (1, 13)
        torch.testing.assert_close(model(ids.to("neuron")).logits.cpu(), ref, atol=1e-4, rtol=1e-4)
