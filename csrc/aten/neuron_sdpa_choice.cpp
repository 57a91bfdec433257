// Which scaled-dot-product-attention backend runs on neuron: the one PyTorch picks on CPU for the same
// inputs. Without a choice registered for the device, PyTorch takes the math path, whose low-precision
// rounding differs from the CPU's fused kernel, so bfloat16 attention (and greedy tokens) would differ.
// The chosen fused CPU kernel then runs on the device memory like any other operator.
#include "aten/neuron_aten.h"

#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>

namespace torch_neuronx {
namespace {

int64_t neuron_fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                                std::optional<double> scale, bool enable_gqa) {
  auto cpu = [](const at::Tensor& t) { return t.defined() && t.is_privateuseone() ? cpu_alias(t) : t; };
  std::optional<at::Tensor> mask;
  if (attn_mask.has_value()) mask = cpu(*attn_mask);
  return at::_fused_sdp_choice(cpu(query), cpu(key), cpu(value), mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace torch_neuronx

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_neuronx::neuron_fused_sdp_choice)
}  // namespace at::native
