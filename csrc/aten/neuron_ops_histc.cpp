// torch.histc on neuron: integer inputs count with CUDA's rules (accelerator code such as Transformers'
// Mixture-of-Experts routing relies on them); floating inputs run PyTorch's CPU kernel on the device memory.
#include "aten/neuron_aten.h"

#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <vector>

namespace torch_neuronx {
namespace {

at::Tensor& neuron_histc_out(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max,
                             at::Tensor& out) {
  NEURON_NATIVE("aten::histc.out");
  TORCH_CHECK(bins > 0, "torch.histogram(): bins must be > 0, but got ", bins, " for dimension 0");
  TORCH_CHECK(out.dtype() == self.dtype(), "torch.histogram: input tensor and hist tensor should have the same dtype, "
              "but got input ", self.dtype(), " and hist ", out.dtype());
  TORCH_CHECK(out.device() == self.device(), "Expected all tensors to be on the same device, but found at least two "
              "devices, ", self.device(), " and ", out.device(), "!");
  at::native::resize_output(out, {bins});
  if (at::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
    int64_t lo = min.to<int64_t>(), hi = max.to<int64_t>();
    TORCH_CHECK(lo <= hi, "torch.histc: max must be larger than min");
    nk_tensor h, s;
    if (to_nk(out, &h) && to_nk(self, &s)) {
      std::vector<int64_t> counts(static_cast<size_t>(bins));
      nk_status st = nk_histc_int(&h, &s, lo, hi, counts.data());
      if (st == NK_SUCCESS) return out;
      if (st != NK_UNSUPPORTED) raise_kernel_status(st, "histc", self);
    }
  }
  // Floating (and unsupported) dtypes: the CPU kernel, which also raises its own errors.
  at::Tensor a = cpu_alias(out);
  at::histc_out(a, cpu_alias(self), bins, min, max);
  return out;
}

at::Tensor neuron_histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  NEURON_NATIVE("aten::histc");
  at::Tensor out = at::empty({0}, self.options());
  return neuron_histc_out(self, bins, min, max, out);
}

}  // namespace
}  // namespace torch_neuronx

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", torch_neuronx::neuron_histc);
  m.impl("histc.out", torch_neuronx::neuron_histc_out);
}
