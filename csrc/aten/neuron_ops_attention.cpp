// Scaled dot-product attention on neuron: the backend choice and PyTorch's "overrideable" fused SDPA
// entry points (forward and backward), bound to the C kernels of kernels/attention.c.
#include <algorithm>
#include <array>
#include "aten/neuron_aten.h"

#include <ATen/Context.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <torch/library.h>

#include <cmath>
#include <mutex>

namespace torch_neuronx {
namespace {

bool sdpa_dtype_ok(at::ScalarType st) { return st == at::kFloat || st == at::kBFloat16 || st == at::kHalf; }

// Whether the fused kernel covers a call; otherwise PyTorch's math composition runs (and raises the
// same errors as on CPU for bad inputs).
bool sdpa_fused_ok(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& mask, bool is_causal, bool enable_gqa) {
  if (!at::globalContext().userEnabledOverrideableSDP()) return false;
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->dim() != 4 || t->is_nested() || !t->is_privateuseone() || t->layout() != at::kStrided) return false;
    if (t->scalar_type() != q.scalar_type() || t->is_conj() || t->is_neg()) return false;
  }
  if (!sdpa_dtype_ok(q.scalar_type())) return false;
  if (k.device() != q.device() || v.device() != q.device()) return false;
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0) || v.size(1) != k.size(1) || v.size(2) != k.size(2) ||
      k.size(3) != q.size(3))
    return false;
  const int64_t hq = q.size(1), hkv = k.size(1);
  if (hq != hkv && !(enable_gqa && hkv > 0 && hq % hkv == 0)) return false;
  if (mask.has_value() && mask->defined()) {
    const at::Tensor& m = *mask;
    if (is_causal) return false;  // PyTorch rejects the combination: let the math path raise
    if (m.device() != q.device() || m.is_nested() || m.layout() != at::kStrided || m.dim() > 4) return false;
    if (m.scalar_type() != at::kBool && m.scalar_type() != q.scalar_type()) return false;
    const int64_t full[4] = {q.size(0), hq, q.size(2), k.size(2)};
    for (int64_t d = 0; d < m.dim(); ++d) {
      const int64_t s = m.size(m.dim() - 1 - d);
      if (s != 1 && s != full[3 - d]) return false;
    }
  }
  return true;
}

int64_t neuron_fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                                std::optional<double> scale, bool enable_gqa) {
  return static_cast<int64_t>(sdpa_fused_ok(q, k, v, mask, is_causal, enable_gqa) ? at::SDPBackend::overrideable
                                                                                  : at::SDPBackend::math);
}

int64_t neuron_fused_sdp_choice_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                                   std::optional<double> scale, bool enable_gqa) {
  NEURON_NATIVE("aten::_fused_sdp_choice");
  return neuron_fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}

nk_tensor nk_of(const at::Tensor& t, const char* what) {
  nk_tensor d;
  TORCH_CHECK(to_nk(t, &d), "scaled_dot_product_attention: unsupported ", what, " tensor (dtype ", t.scalar_type(),
              ", ", t.dim(), " dims) on neuron");
  return d;
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "_scaled_dot_product_fused_attention_overrideable: expected 4-D query, key and value, got ", q.dim(),
              "-D, ", k.dim(), "-D and ", v.dim(), "-D");
  TORCH_CHECK(sdpa_dtype_ok(q.scalar_type()) && k.scalar_type() == q.scalar_type() &&
                  v.scalar_type() == q.scalar_type(),
              "_scaled_dot_product_fused_attention_overrideable: query, key and value must have one dtype among "
              "float32, bfloat16 and float16 on neuron, got ",
              q.scalar_type(), ", ", k.scalar_type(), " and ", v.scalar_type());
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2) &&
                  k.size(3) == q.size(3),
              "_scaled_dot_product_fused_attention_overrideable: incompatible shapes query ", q.sizes(), ", key ",
              k.sizes(), ", value ", v.sizes());
  TORCH_CHECK(k.size(1) > 0 ? q.size(1) % k.size(1) == 0 : q.size(1) == 0,
              "_scaled_dot_product_fused_attention_overrideable: the number of query heads (", q.size(1),
              ") must be a multiple of the number of key/value heads (", k.size(1), ")");
}

// The mask as the kernel reads it: expanded (stride 0) to [B, Hq, Lq, Lk].
at::Tensor expand_mask(const std::optional<at::Tensor>& bias, const at::Tensor& q, const at::Tensor& k) {
  if (!bias.has_value() || !bias->defined()) return at::Tensor();
  return bias->expand({q.size(0), q.size(1), q.size(2), k.size(2)});
}

uint64_t round_up4(uint64_t x) { return (x + 3) & ~uint64_t(3); }

at::Tensor u64_scalar(uint64_t v) {
  at::Tensor t = at::empty({}, at::TensorOptions().dtype(at::kLong));
  t.fill_(static_cast<int64_t>(v));
  return t;
}

// The output layout PyTorch's meta function gives this op (torch.compile checks results against it): the
// query's layout when the shapes agree, else the query's dimension order with dense strides.
at::Tensor alloc_like_query(const at::Tensor& q, c10::IntArrayRef shape) {
  if (q.sizes() == shape) return at::empty_like(q);
  std::array<int64_t, 4> order{0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return q.stride(a) > q.stride(b); });
  std::array<int64_t, 4> strides{};
  int64_t stride = 1;
  for (int i = 3; i >= 0; i--) {
    strides[order[i]] = stride;
    stride *= shape[order[i]];
  }
  return at::empty_strided(shape, strides, q.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
neuron_sdpa_overrideable(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal,
                         bool return_debug_mask, std::optional<double> scale) {
  NEURON_NATIVE("aten::_scaled_dot_product_fused_attention_overrideable");
  check_inputs(q, k, v);
  TORCH_CHECK(!return_debug_mask, "_scaled_dot_product_fused_attention_overrideable: return_debug_mask is not "
              "supported on neuron");
  c10::DeviceGuard guard(q.device());
  const int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), Lk = k.size(2), Dv = v.size(3);
  at::Tensor out = alloc_like_query(q, {B, Hq, Lq, Dv});
  at::Tensor lse = at::empty({B, Hq, Lq}, q.options().dtype(at::kFloat));
  at::Tensor mask = expand_mask(attn_bias, q, k);
  nk_tensor tq = nk_of(q, "query"), tk = nk_of(k, "key"), tv = nk_of(v, "value"), to = nk_of(out, "output"),
            tl = nk_of(lse, "logsumexp"), tm;
  if (mask.defined()) tm = nk_of(mask, "attn_mask");
  nk_sdpa_args a{};
  a.q = &tq;
  a.k = &tk;
  a.v = &tv;
  a.mask = mask.defined() ? &tm : nullptr;
  a.scale = sdp::calculate_scale(q, scale).expect_float();
  a.causal = is_causal;
  a.dropout_p = dropout_p;
  at::Tensor seed_t, offset_t;
  if (dropout_p > 0.0) {
    NeuronGeneratorImpl* g = get_generator(std::nullopt, q.device().index());
    std::lock_guard<std::mutex> lock(g->mutex_);
    a.seed = g->seed_value();
    a.offset = *g->offset_ptr();
    *g->offset_ptr() += round_up4(static_cast<uint64_t>(B * Hq * Lq * Lk));
    seed_t = u64_scalar(a.seed);
    offset_t = u64_scalar(a.offset);
  } else {
    // 0-dim like PyTorch's meta function says (values unused without dropout).
    seed_t = at::zeros({}, at::TensorOptions().dtype(at::kLong));
    offset_t = at::zeros({}, at::TensorOptions().dtype(at::kLong));
  }
  nk_status st = nk_sdpa_forward(&a, &to, &tl);
  if (st != NK_SUCCESS) raise_kernel_status(st, "scaled_dot_product_attention", q);
  return {out, lse, at::Tensor(), at::Tensor(), c10::SymInt(Lq), c10::SymInt(Lk), seed_t, offset_t, at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> neuron_sdpa_overrideable_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, c10::SymInt max_q,
    c10::SymInt max_k, double dropout_p, bool is_causal, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, std::optional<double> scale) {
  NEURON_NATIVE("aten::_scaled_dot_product_fused_attention_overrideable_backward");
  check_inputs(q, k, v);
  c10::DeviceGuard guard(q.device());
  // Layouts as PyTorch's meta function states them (torch.compile checks results against it).
  at::Tensor dq = at::empty_like(q);
  at::Tensor dk = at::empty_like(k);
  at::Tensor dv = at::empty_like(v);
  if (!grad_out.defined()) return {dq.zero_(), dk.zero_(), dv.zero_(), at::Tensor()};
  at::Tensor go = grad_out.scalar_type() == q.scalar_type() ? grad_out : grad_out.to(q.scalar_type());
  std::optional<at::Tensor> bias;
  if (attn_bias.defined()) bias = attn_bias;
  at::Tensor mask = expand_mask(bias, q, k);
  const bool want_dbias = grad_input_mask[3] && attn_bias.defined() && at::isFloatingType(attn_bias.scalar_type());
  at::Tensor dmask;
  if (want_dbias) dmask = at::empty({q.size(0), q.size(1), q.size(2), k.size(2)}, q.options().dtype(at::kFloat));
  nk_tensor tq = nk_of(q, "query"), tk = nk_of(k, "key"), tv = nk_of(v, "value"), to = nk_of(out, "output"),
            tl = nk_of(logsumexp, "logsumexp"), tgo = nk_of(go, "grad_out"), tdq = nk_of(dq, "grad_query"),
            tdk = nk_of(dk, "grad_key"), tdv = nk_of(dv, "grad_value"), tm, tdm;
  if (mask.defined()) tm = nk_of(mask, "attn_mask");
  if (want_dbias) tdm = nk_of(dmask, "grad_attn_mask");
  nk_sdpa_args a{};
  a.q = &tq;
  a.k = &tk;
  a.v = &tv;
  a.mask = mask.defined() ? &tm : nullptr;
  a.scale = sdp::calculate_scale(q, scale).expect_float();
  a.causal = is_causal;
  a.dropout_p = dropout_p;
  if (dropout_p > 0.0) {
    TORCH_CHECK(philox_seed.numel() == 1 && philox_offset.numel() == 1,
                "_scaled_dot_product_fused_attention_overrideable_backward: dropout needs the forward's philox "
                "seed and offset");
    a.seed = static_cast<uint64_t>(philox_seed.item<int64_t>());
    a.offset = static_cast<uint64_t>(philox_offset.item<int64_t>());
  }
  nk_status st = nk_sdpa_backward(&a, &to, &tl, &tgo, &tdq, &tdk, &tdv, want_dbias ? &tdm : nullptr);
  if (st != NK_SUCCESS) raise_kernel_status(st, "scaled_dot_product_attention backward", q);
  at::Tensor dbias;
  if (want_dbias) dbias = dmask.to(attn_bias.scalar_type()).sum_to_size(attn_bias.sizes());
  return {dq, dk, dv, dbias};
}

}  // namespace
}  // namespace torch_neuronx

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_neuronx::neuron_fused_sdp_choice)
}  // namespace at::native

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", torch_neuronx::neuron_fused_sdp_choice_op);
  m.impl("_scaled_dot_product_fused_attention_overrideable", torch_neuronx::neuron_sdpa_overrideable);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward",
         torch_neuronx::neuron_sdpa_overrideable_backward);
}
