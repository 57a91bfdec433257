// Indexing operators on neuron: index_select (and so embedding), embedding backward, gather,
// scatter/scatter_add, index_copy_, index_add_, cat, bound to the C kernels of kernels/index.c.
//
// Index tensors may live on neuron or on the CPU (both are host-addressable), as CUDA accepts CPU
// indices. Whenever a kernel declines a call (dtype, shape, an out-of-range index) the CPU kernel runs
// on aliases of the same memory: results then equal the CPU's and bad input raises PyTorch's own error.
// Kernels validate every index before writing, so the CPU rerun sees the tensors untouched.
#include "aten/neuron_aten.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <ATen/WrapDimUtils.h>
#include <torch/library.h>

namespace torch_neuronx {
namespace {

at::Tensor host(const at::Tensor& t) { return t.is_privateuseone() ? cpu_alias(t) : t; }

// A neuron copy of a CPU result.
at::Tensor to_device(const at::Tensor& r, const at::Tensor& like) { return r.to(like.device()); }

bool nk2(const at::Tensor& a, nk_tensor* ta, const at::Tensor& b, nk_tensor* tb) { return to_nk(a, ta) && to_nk(b, tb); }

bool index_ok(const at::Tensor& index, bool allow_int) {
  return index.scalar_type() == at::kLong || (allow_int && index.scalar_type() == at::kInt);
}

int32_t wrap(int64_t dim, const at::Tensor& t) { return static_cast<int32_t>(at::maybe_wrap_dim(dim, t.dim())); }

// ---- index_select / embedding ----------------------------------------------------------------------

at::Tensor& index_select_out_impl(const at::Tensor& self, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  if (index_ok(index, true) && index.dim() <= 1 && out.scalar_type() == self.scalar_type() && self.dim() > 0) {
    const int32_t d = wrap(dim, self);
    std::vector<int64_t> sizes = self.sizes().vec();
    sizes[d] = index.numel();
    if (out.sizes() != at::IntArrayRef(sizes)) out.resize_(sizes);
    nk_tensor to, ts, ti;
    if (nk2(out, &to, self, &ts) && to_nk(index, &ti) && !out.is_same(self)) {
      int64_t bad = INT64_MIN;
      nk_status st = nk_index_select(&to, &ts, d, &ti, &bad);
      if (st == NK_SUCCESS) return out;
      TORCH_CHECK_INDEX(bad == INT64_MIN, "index out of range in self");
    }
  }
  at::Tensor r = at::index_select(host(self), dim, host(index));
  out.resize_(r.sizes());
  out.copy_(r);
  return out;
}

at::Tensor neuron_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  NEURON_NATIVE("aten::index_select");
  at::Tensor out = at::empty({0}, self.options());
  return index_select_out_impl(self, dim, index, out);
}

at::Tensor& neuron_index_select_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  NEURON_NATIVE("aten::index_select.out");
  // What PyTorch's CPU kernel checks of an out= tensor, before anything is written.
  TORCH_CHECK(self.scalar_type() == out.scalar_type(), "index_select(): self and result must have the same scalar type");
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, self);
  at::assert_no_overlap(out, index);
  return index_select_out_impl(self, dim, index, out);
}

at::Tensor neuron_embedding_dense_backward(const at::Tensor& grad_output, const at::Tensor& indices,
                                           c10::SymInt num_weights_s, c10::SymInt padding_idx_s,
                                           bool scale_grad_by_freq) {
  NEURON_NATIVE("aten::embedding_dense_backward");
  const int64_t num_weights = num_weights_s.expect_int(), padding_idx = padding_idx_s.expect_int();
  at::Tensor idx = indices.reshape({-1});
  const int64_t D = grad_output.size(-1);
  at::Tensor grad = grad_output.reshape({idx.numel(), D});
  at::Tensor gw = at::empty({num_weights, D}, grad_output.options());
  nk_tensor tw, tg, ti;
  if (index_ok(idx, true) && nk2(gw, &tw, grad, &tg) && to_nk(idx, &ti)) {
    int64_t bad = INT64_MIN;
    nk_status st = nk_embedding_backward(&tw, &tg, &ti, padding_idx, scale_grad_by_freq, &bad);
    if (st == NK_SUCCESS) return gw;
  }
  return to_device(at::embedding_dense_backward(host(grad_output), host(indices), num_weights, padding_idx,
                                                scale_grad_by_freq),
                   grad_output);
}

// ---- gather / scatter ------------------------------------------------------------------------------

at::Tensor& gather_out_impl(const at::Tensor& self, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  if (index_ok(index, true) && out.scalar_type() == self.scalar_type() && index.dim() == self.dim() &&
      !out.is_same(self)) {
    const int32_t d = self.dim() ? wrap(dim, self) : 0;
    if (!out.sizes().equals(index.sizes())) out.resize_(index.sizes());
    nk_tensor to, ts, ti;
    if (nk2(out, &to, self, &ts) && to_nk(index, &ti)) {
      int64_t bad = INT64_MIN;
      if (nk_gather(&to, &ts, d, &ti, &bad) == NK_SUCCESS) return out;
    }
  }
  at::Tensor r = at::gather(host(self), dim, host(index));
  out.resize_(r.sizes());
  out.copy_(r);
  return out;
}

at::Tensor neuron_gather(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sparse_grad) {
  NEURON_NATIVE("aten::gather");
  at::Tensor out = at::empty(index.sizes(), self.options());
  return gather_out_impl(self, dim, index, out);
}

at::Tensor& neuron_gather_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sparse_grad,
                              at::Tensor& out) {
  NEURON_NATIVE("aten::gather.out");
  // What PyTorch's structured gather checks of an out= tensor, before anything is written.
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "Expected out tensor to have dtype ", self.dtype(),
              ", but got ", out.dtype(), " instead");
  at::native::resize_output(out, index.sizes());  // first, as the structured kernel: overlap is that of the result
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, self);
  at::assert_no_partial_overlap(out, index);
  return gather_out_impl(self, dim, index, out);
}

bool reduced_float(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

// self.scatter_(dim, index, src or value), accumulate for scatter_add_.
at::Tensor& scatter_inplace(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor* src,
                            const at::Scalar* value, bool accumulate) {
  if (accumulate && src != nullptr && reduced_float(self) && src->scalar_type() == self.scalar_type()) {
    // PyTorch's CPU kernel sums half and bfloat16 contributions in float and rounds each element once;
    // rounding after every addition drifts by several ulps where many indices meet.
    at::Tensor wide = self.to(at::kFloat);
    const at::Tensor wide_src = src->to(at::kFloat);
    scatter_inplace(wide, dim, index, &wide_src, nullptr, true);
    self.copy_(wide);
    return self;
  }
  bool simple_value = value == nullptr || value->isFloatingPoint() || value->isIntegral(false) || value->isBoolean();
  if (index_ok(index, true) && index.dim() == self.dim() && simple_value &&
      (src == nullptr || (src->scalar_type() == self.scalar_type() && src->dim() == self.dim() &&
                          !src->is_same(self)))) {
    const int32_t d = self.dim() ? wrap(dim, self) : 0;
    nk_tensor tself, ti, tsrc;
    if (to_nk(self, &tself) && to_nk(index, &ti) && (src == nullptr || to_nk(*src, &tsrc))) {
      nk_scalar v{};
      if (value != nullptr) {
        if (value->isFloatingPoint()) {
          v.is_float = true;
          v.f = value->toDouble();
        } else {
          v.i = value->isBoolean() ? static_cast<int64_t>(value->toBool()) : value->toLong();
        }
      }
      int64_t bad = INT64_MIN;
      if (nk_scatter(&tself, d, &ti, src ? &tsrc : nullptr, v, accumulate, &bad) == NK_SUCCESS) return self;
    }
  }
  at::Tensor s = host(self);
  if (accumulate) {
    s.scatter_add_(dim, host(index), host(*src));
  } else if (src != nullptr) {
    s.scatter_(dim, host(index), host(*src));
  } else {
    s.scatter_(dim, host(index), *value);
  }
  return self;
}

at::Tensor& neuron_scatter_src_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  NEURON_NATIVE("aten::scatter_.src");
  return scatter_inplace(self, dim, index, &src, nullptr, false);
}

at::Tensor& neuron_scatter_value_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value) {
  NEURON_NATIVE("aten::scatter_.value");
  return scatter_inplace(self, dim, index, nullptr, &value, false);
}

at::Tensor& neuron_scatter_add_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  NEURON_NATIVE("aten::scatter_add_");
  return scatter_inplace(self, dim, index, &src, nullptr, true);
}

at::Tensor neuron_scatter_src(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  NEURON_NATIVE("aten::scatter.src");
  at::Tensor out = self.clone();
  return scatter_inplace(out, dim, index, &src, nullptr, false);
}

at::Tensor neuron_scatter_value(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value) {
  NEURON_NATIVE("aten::scatter.value");
  at::Tensor out = self.clone();
  return scatter_inplace(out, dim, index, nullptr, &value, false);
}

at::Tensor neuron_scatter_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src) {
  NEURON_NATIVE("aten::scatter_add");
  at::Tensor out = self.clone();
  return scatter_inplace(out, dim, index, &src, nullptr, true);
}

// ---- index_copy_ / index_add_ ----------------------------------------------------------------------

at::Tensor& index_copy_inplace(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source) {
  if (index_ok(index, false) && index.dim() <= 1 && source.scalar_type() == self.scalar_type() &&
      source.dim() == self.dim() && !source.is_same(self)) {
    const int32_t d = self.dim() ? wrap(dim, self) : 0;
    nk_tensor tself, ti, tsrc;
    if (nk2(self, &tself, source, &tsrc) && to_nk(index, &ti)) {
      int64_t bad = INT64_MIN;
      if (nk_index_copy(&tself, d, &ti, &tsrc, &bad) == NK_SUCCESS) return self;
      // Checked before any write, so unlike the CPU kernel the destination is left untouched.
      TORCH_CHECK_INDEX(bad == INT64_MIN, "index_copy_(): index ", bad, " is out of bounds for dimension ", d,
                        " with size ", self.dim() ? self.size(d) : 1);
    }
  }
  host(self).index_copy_(dim, host(index), host(source));
  return self;
}

at::Tensor& neuron_index_copy_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source) {
  NEURON_NATIVE("aten::index_copy_");
  return index_copy_inplace(self, dim, index, source);
}

at::Tensor neuron_index_copy(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source) {
  NEURON_NATIVE("aten::index_copy");
  at::Tensor out = self.clone();
  return index_copy_inplace(out, dim, index, source);
}

at::Tensor& index_add_inplace(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                              const at::Scalar& alpha) {
  if (reduced_float(self) && source.scalar_type() == self.scalar_type() && source.dim() == self.dim() &&
      !source.is_same(self) && !alpha.isComplex()) {
    // PyTorch's CPU kernel, for half and bfloat16 along the first or last dimension of a tensor of 2+
    // dims with an int64 index and alpha 1, is a scatter_add: summed in float, rounded once per element.
    // Elsewhere it adds one slice after another, rounding each time, as the kernel below does. (With
    // alpha != 1 its vectorised and scalar loops round source * alpha differently; ours rounds once.)
    const int64_t d = self.dim() ? wrap(dim, self) : 0;
    const bool one = alpha.isIntegral(true) ? alpha.toLong() == 1 : alpha.toDouble() == 1.0;
    if (self.dim() > 1 && (d == 0 || d == self.dim() - 1) && index.scalar_type() == at::kLong && one) {
      at::Tensor wide = self.to(at::kFloat);
      index_add_inplace(wide, d, index, source.to(at::kFloat), 1);
      self.copy_(wide);
      return self;
    }
  }
  if (index_ok(index, true) && index.dim() <= 1 && source.scalar_type() == self.scalar_type() &&
      source.dim() == self.dim() && !source.is_same(self) && (alpha.isFloatingPoint() || alpha.isIntegral(false))) {
    const int32_t d = self.dim() ? wrap(dim, self) : 0;
    nk_tensor tself, ti, tsrc;
    if (nk2(self, &tself, source, &tsrc) && to_nk(index, &ti)) {
      nk_scalar a{};
      if (alpha.isFloatingPoint()) {
        a.is_float = true;
        a.f = alpha.toDouble();
      } else {
        a.i = alpha.toLong();
      }
      int64_t bad = INT64_MIN;
      if (nk_index_add(&tself, d, &ti, &tsrc, a, &bad) == NK_SUCCESS) return self;
    }
  }
  host(self).index_add_(dim, host(index), host(source), alpha);
  return self;
}

at::Tensor& neuron_index_add_(at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                              const at::Scalar& alpha) {
  NEURON_NATIVE("aten::index_add_");
  return index_add_inplace(self, dim, index, source, alpha);
}

at::Tensor neuron_index_add(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                            const at::Scalar& alpha) {
  NEURON_NATIVE("aten::index_add");
  at::Tensor out = self.clone();
  return index_add_inplace(out, dim, index, source, alpha);
}

// ---- cat -------------------------------------------------------------------------------------------

// Writes cat(tensors, dim) into *out (allocated here when undefined); false when the CPU kernel must
// run instead (mixed devices, channels-last inputs, bad shapes: it raises PyTorch's errors).
bool cat_native(const at::ITensorListRef& tensors, int64_t dim, at::Tensor& out, bool allocate) {
  auto ts = tensors.materialize();
  const at::Tensor* ref = nullptr;
  at::ScalarType dtype = at::ScalarType::Undefined;
  for (const at::Tensor& t : ts) {
    dtype = dtype == at::ScalarType::Undefined ? t.scalar_type() : c10::promoteTypes(dtype, t.scalar_type());
    if (!(t.dim() == 1 && t.numel() == 0) && ref == nullptr) ref = &t;  // legacy empty tensors are skipped
  }
  if (ref == nullptr || ref->dim() == 0) return false;
  const int64_t d = at::maybe_wrap_dim(dim, ref->dim());
  std::vector<int64_t> sizes = ref->sizes().vec();
  sizes[d] = 0;
  std::vector<nk_tensor> descs;
  for (const at::Tensor& t : ts) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    if (!t.is_privateuseone() || t.dim() != ref->dim() || t.suggest_memory_format() != at::MemoryFormat::Contiguous)
      return false;
    for (int64_t k = 0; k < t.dim(); ++k)
      if (k != d && t.size(k) != ref->size(k)) return false;
    sizes[d] += t.size(d);
    nk_tensor n;
    if (!to_nk(t, &n)) return false;
    descs.push_back(n);
  }
  if (allocate) {
    out = at::empty(sizes, ref->options().dtype(dtype));
  } else {
    if (out.scalar_type() != dtype || !out.is_privateuseone()) return false;
    for (const at::Tensor& t : ts)
      if (t.numel() && out.numel() && t.storage().is_alias_of(out.storage())) return false;
    if (!out.sizes().equals(sizes)) out.resize_(sizes);
  }
  nk_tensor to;
  if (!to_nk(out, &to)) return false;
  std::vector<const nk_tensor*> ptrs;
  for (auto& n : descs) ptrs.push_back(&n);
  return nk_cat(&to, ptrs.data(), static_cast<int64_t>(ptrs.size()), static_cast<int32_t>(d)) == NK_SUCCESS;
}

std::vector<at::Tensor> hosts(const at::ITensorListRef& tensors) {
  std::vector<at::Tensor> v;
  for (const at::Tensor& t : tensors) v.push_back(host(t));
  return v;
}

at::Tensor neuron_cat(const at::ITensorListRef& tensors, int64_t dim) {
  NEURON_NATIVE("aten::cat");
  at::Tensor out;
  if (cat_native(tensors, dim, out, true)) return out;
  auto ts = tensors.materialize();
  at::Tensor r = at::cat(hosts(tensors), dim);
  for (const at::Tensor& t : ts)
    if (t.is_privateuseone()) return to_device(r, t);
  return r;
}

at::Tensor& neuron_cat_out(const at::ITensorListRef& tensors, int64_t dim, at::Tensor& out) {
  NEURON_NATIVE("aten::cat.out");
  if (cat_native(tensors, dim, out, false)) return out;
  at::Tensor r = at::cat(hosts(tensors), dim);
  out.resize_(r.sizes());
  out.copy_(r);
  return out;
}

}  // namespace
}  // namespace torch_neuronx

using namespace torch_neuronx;

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("index_select", neuron_index_select);
  m.impl("index_select.out", neuron_index_select_out);
  m.impl("embedding_dense_backward", neuron_embedding_dense_backward);
  m.impl("gather", neuron_gather);
  m.impl("gather.out", neuron_gather_out);
  m.impl("scatter.src", neuron_scatter_src);
  m.impl("scatter_.src", neuron_scatter_src_);
  m.impl("scatter.value", neuron_scatter_value);
  m.impl("scatter_.value", neuron_scatter_value_);
  m.impl("scatter_add", neuron_scatter_add);
  m.impl("scatter_add_", neuron_scatter_add_);
  m.impl("index_copy", neuron_index_copy);
  m.impl("index_copy_", neuron_index_copy_);
  m.impl("index_add", neuron_index_add);
  m.impl("index_add_", neuron_index_add_);
  m.impl("cat", neuron_cat);
  m.impl("cat.out", neuron_cat_out);
}
