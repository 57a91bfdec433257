// Native reductions, softmax, norms and nll_loss for the neuron device. Shapes, dtypes and errors
// follow PyTorch's CPU kernels; anything the C kernels do not implement (a dtype, an empty input, an
// overlapping out=) runs the CPU kernel on aliased memory so results always equal CPU.
#include "aten/neuron_aten.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/ReduceOpsUtils.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <cfloat>

namespace torch_neuronx {
namespace {

// ---- helpers --------------------------------------------------------------------------------------

uint64_t mask_bits(const at::native::DimMask& mask, int64_t ndim) {
  uint64_t m = 0;
  for (int64_t d = 0; d < ndim; ++d)
    if (mask[d]) m |= uint64_t{1} << d;
  return m;
}

// Descriptor of a reduction result seen with the input's ndim (size 1, stride 0 in reduced dims).
bool nk_keepdim(const at::Tensor& out, int64_t ndim, uint64_t mask, bool keepdim, nk_tensor* d) {
  if (!to_nk(out, d) || ndim > NK_MAX_DIMS) return false;
  if (keepdim) return out.dim() == ndim;
  nk_tensor k = *d;
  int64_t src = 0;
  for (int64_t i = 0; i < ndim; ++i) {
    if ((mask >> i) & 1u) {
      k.sizes[i] = 1;
      k.strides[i] = 0;
    } else {
      if (src >= out.dim()) return false;
      k.sizes[i] = out.size(src);
      k.strides[i] = out.stride(src);
      ++src;
    }
  }
  if (src != out.dim()) return false;
  k.ndim = static_cast<int32_t>(ndim);
  *d = k;
  return true;
}

// Whether the kernel may write `out` while reading `in`.
bool separate(const at::Tensor& out, const at::Tensor& in) {
  return !in.defined() || at::get_overlap_status(out, in) == at::MemOverlapStatus::No;
}

bool is_half_or_float(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

// A new neuron tensor holding a CPU result (the rare fallback of functional ops).
at::Tensor to_neuron(const at::Tensor& cpu, const at::Device& device) {
  if (!cpu.defined()) return cpu;
  at::Tensor n = at::empty_strided(cpu.sizes(), cpu.strides(), cpu.options().device(device));
  if (n.numel()) cpu_alias(n).copy_(cpu);
  return n;
}

at::Tensor alias_or_undef(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? cpu_alias(*t) : at::Tensor();
}

// Runs a kernel; true on success, false when it does not implement the case (fall back).
bool ok(nk_status s, const char* op, const at::Tensor& t) {
  if (s == NK_SUCCESS) return true;
  if (s == NK_UNSUPPORTED) return false;
  raise_kernel_status(s, op, t);
}

// The CPU kernel of an out= op run into a CPU tensor of out's shape and dtype (so its checks and resize
// warnings are the CPU's), then copied into out.
template <typename F>
at::Tensor& cpu_out(at::Tensor& out, F&& f) {
  at::Tensor r = at::empty(out.sizes(), out.options().device(at::kCPU));
  f(r);
  if (!out.sizes().equals(r.sizes())) out.resize_(r.sizes());
  if (r.numel()) cpu_alias(out).copy_(r);
  return out;
}

// ---- sum, mean, amax, amin, any, all --------------------------------------------------------------

// The common body of the plain reductions; false means "use the CPU kernel".
bool reduce_native(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim, at::Tensor& out,
                   nk_reduce_op op, bool allow_empty_dims = false) {
  const int64_t ndim = self.dim();
  auto mask = at::native::make_dim_mask(dim, ndim, allow_empty_dims);
  at::native::resize_output(out, at::native::shape_from_dim_mask(self, mask, keepdim));
  if (self.numel() == 0 || !separate(out, self)) return false;
  const uint64_t m = mask_bits(mask, ndim);
  nk_tensor o, in;
  if (!to_nk(self, &in) || !nk_keepdim(out, ndim, m, keepdim, &o)) return false;
  return ok(nk_reduce(&o, &in, m, op), "reduction", self);
}

at::Tensor& neuron_sum_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                           std::optional<at::ScalarType> dtype, at::Tensor& out) {
  NEURON_NATIVE("aten::sum.IntList_out");
  if ((dtype && *dtype != out.scalar_type()) || !reduce_native(self, dim, keepdim, out, NK_REDUCE_SUM)) {
    at::Tensor o = cpu_alias(out);
    at::sum_out(o, cpu_alias(self), dim, keepdim, dtype);
  }
  return out;
}

at::Tensor& neuron_mean_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype, at::Tensor& out) {
  NEURON_NATIVE("aten::mean.out");
  if ((dtype && *dtype != out.scalar_type()) || !at::isFloatingType(self.scalar_type()) ||
      !reduce_native(self, dim, keepdim, out, NK_REDUCE_MEAN)) {
    at::Tensor o = cpu_alias(out);
    at::mean_out(o, cpu_alias(self), dim, keepdim, dtype);
  }
  return out;
}

at::Tensor& neuron_amax_out(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::amax.out");
  if (out.scalar_type() != self.scalar_type() || !reduce_native(self, dim, keepdim, out, NK_REDUCE_AMAX)) {
    at::Tensor o = cpu_alias(out);
    at::amax_out(o, cpu_alias(self), dim, keepdim);
  }
  return out;
}

at::Tensor& neuron_amin_out(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::amin.out");
  if (out.scalar_type() != self.scalar_type() || !reduce_native(self, dim, keepdim, out, NK_REDUCE_AMIN)) {
    at::Tensor o = cpu_alias(out);
    at::amin_out(o, cpu_alias(self), dim, keepdim);
  }
  return out;
}

bool allany_ok(const at::Tensor& self, const at::Tensor& out) {
  // PyTorch returns uint8 for uint8 inputs, bool otherwise.
  return out.scalar_type() == (self.scalar_type() == at::kByte ? at::kByte : at::kBool);
}

at::Tensor& neuron_any_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::any.out");
  if (!allany_ok(self, out) || !reduce_native(self, at::IntArrayRef(dim), keepdim, out, NK_REDUCE_ANY)) {
    at::Tensor o = cpu_alias(out);
    at::any_out(o, cpu_alias(self), dim, keepdim);
  }
  return out;
}

at::Tensor& neuron_any_dims_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::any.dims_out");
  // An empty dim list means "no dims" here, which the CPU kernel handles (a copy).
  if ((dim.has_value() && dim->empty()) || !allany_ok(self, out) ||
      !reduce_native(self, dim, keepdim, out, NK_REDUCE_ANY)) {
    at::Tensor o = cpu_alias(out);
    at::any_out(o, cpu_alias(self), dim, keepdim);
  }
  return out;
}

at::Tensor& neuron_any_all_out(const at::Tensor& self, at::Tensor& out) {
  NEURON_NATIVE("aten::any.all_out");
  if (!allany_ok(self, out) || !reduce_native(self, std::nullopt, false, out, NK_REDUCE_ANY)) {
    at::Tensor o = cpu_alias(out);
    at::any_out(o, cpu_alias(self));
  }
  return out;
}

at::Tensor& neuron_all_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::all.out");
  if (!allany_ok(self, out) || !reduce_native(self, at::IntArrayRef(dim), keepdim, out, NK_REDUCE_ALL)) {
    at::Tensor o = cpu_alias(out);
    at::all_out(o, cpu_alias(self), dim, keepdim);
  }
  return out;
}

at::Tensor& neuron_all_dims_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::all.dims_out");
  if ((dim.has_value() && dim->empty()) || !allany_ok(self, out) ||
      !reduce_native(self, dim, keepdim, out, NK_REDUCE_ALL)) {
    at::Tensor o = cpu_alias(out);
    at::all_out(o, cpu_alias(self), dim, keepdim);
  }
  return out;
}

at::Tensor& neuron_all_all_out(const at::Tensor& self, at::Tensor& out) {
  NEURON_NATIVE("aten::all.all_out");
  if (!allany_ok(self, out) || !reduce_native(self, std::nullopt, false, out, NK_REDUCE_ALL)) {
    at::Tensor o = cpu_alias(out);
    at::all_out(o, cpu_alias(self));
  }
  return out;
}

// PyTorch's CPU logsumexp is a composition (amax, exp(x - max), sum, log, + max) that rounds bf16/fp16 after
// every step; the one-pass kernel rounds once, so those dtypes run the CPU composition on the same memory.
bool logsumexp_native_dtype(at::ScalarType st) { return st == at::kFloat || st == at::kDouble; }

at::Tensor neuron_logsumexp(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  NEURON_NATIVE("aten::logsumexp");
  if (logsumexp_native_dtype(self.scalar_type()) && self.numel() > 0) {
    auto mask = at::native::make_dim_mask(dim, self.dim());
    at::Tensor out = at::empty(at::native::shape_from_dim_mask(self, mask, keepdim), self.options());
    if (reduce_native(self, dim, keepdim, out, NK_REDUCE_LOGSUMEXP)) return out;
  }
  return to_neuron(at::logsumexp(cpu_alias(self), dim, keepdim), self.device());
}

at::Tensor& neuron_logsumexp_out(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::logsumexp.out");
  if (logsumexp_native_dtype(self.scalar_type()) && out.scalar_type() == self.scalar_type() && self.numel() > 0 &&
      out.is_privateuseone() && reduce_native(self, dim, keepdim, out, NK_REDUCE_LOGSUMEXP))
    return out;
  return cpu_out(out, [&](at::Tensor& r) { at::logsumexp_out(r, cpu_alias(self), dim, keepdim); });
}

// ---- max / min / argmax / argmin ------------------------------------------------------------------

// Dtypes of the native max/min over all elements: floats, and integers the kernel's double state holds
// exactly (int64 runs the CPU kernel).
bool minmax_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kBFloat16: case at::kHalf: case at::kDouble:
    case at::kBool: case at::kByte: case at::kChar: case at::kShort: case at::kInt:
      return true;
    default:
      return false;
  }
}

at::Tensor& minmax_unary_out(const at::Tensor& self, at::Tensor& out, bool is_max) {
  if (minmax_dtype(self.scalar_type()) && out.scalar_type() == self.scalar_type() && self.numel() > 0 &&
      out.is_privateuseone() && reduce_native(self, std::nullopt, false, out, is_max ? NK_REDUCE_AMAX : NK_REDUCE_AMIN))
    return out;
  return cpu_out(out, [&](at::Tensor& r) {
    if (is_max) at::max_out(r, cpu_alias(self));
    else at::min_out(r, cpu_alias(self));
  });
}

at::Tensor& neuron_max_unary_out(const at::Tensor& self, at::Tensor& out) {
  NEURON_NATIVE("aten::max.unary_out");
  return minmax_unary_out(self, out, true);
}

at::Tensor& neuron_min_unary_out(const at::Tensor& self, at::Tensor& out) {
  NEURON_NATIVE("aten::min.unary_out");
  return minmax_unary_out(self, out, false);
}

at::Tensor neuron_max_all(const at::Tensor& self) {
  NEURON_NATIVE("aten::max");
  at::Tensor out = at::empty({}, self.options());
  if (minmax_dtype(self.scalar_type())) {
    if (reduce_native(self, std::nullopt, false, out, NK_REDUCE_AMAX)) return out;
  }
  cpu_alias(out).copy_(at::max(cpu_alias(self)));
  return out;
}

at::Tensor neuron_min_all(const at::Tensor& self) {
  NEURON_NATIVE("aten::min");
  at::Tensor out = at::empty({}, self.options());
  if (minmax_dtype(self.scalar_type())) {
    if (reduce_native(self, std::nullopt, false, out, NK_REDUCE_AMIN)) return out;
  }
  cpu_alias(out).copy_(at::min(cpu_alias(self)));
  return out;
}

// values and/or indices over `dim` (nullopt: all dims, flat index).
bool arg_native(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor* values,
                at::Tensor* indices, bool is_max) {
  const int64_t ndim = self.dim();
  at::native::DimMask mask;
  if (dim.has_value()) mask = at::native::make_dim_mask(at::IntArrayRef(*dim), ndim);
  else mask = at::native::make_dim_mask(std::nullopt, ndim);
  auto shape = at::native::shape_from_dim_mask(self, mask, keepdim);
  if (values) at::native::resize_output(*values, shape);
  if (indices) at::native::resize_output(*indices, shape);
  if (self.numel() == 0) return false;
  if (values && (values->scalar_type() != self.scalar_type() || !separate(*values, self))) return false;
  if (indices && (indices->scalar_type() != at::kLong || !separate(*indices, self))) return false;
  if (values && indices && !separate(*values, *indices)) return false;
  const uint64_t m = mask_bits(mask, ndim);
  nk_tensor in, v, i;
  if (!to_nk(self, &in)) return false;
  if (values && !nk_keepdim(*values, ndim, m, keepdim, &v)) return false;
  if (indices && !nk_keepdim(*indices, ndim, m, keepdim, &i)) return false;
  return ok(nk_reduce_arg(values ? &v : nullptr, indices ? &i : nullptr, &in, m, is_max), "max/min", self);
}

std::tuple<at::Tensor&, at::Tensor&> neuron_max_dim_out(const at::Tensor& self, int64_t dim, bool keepdim,
                                                        at::Tensor& values, at::Tensor& indices) {
  NEURON_NATIVE("aten::max.dim_max");
  if (!arg_native(self, dim, keepdim, &values, &indices, true)) {
    at::Tensor v = cpu_alias(values), i = cpu_alias(indices);
    at::max_out(v, i, cpu_alias(self), dim, keepdim);
  }
  return {values, indices};
}

std::tuple<at::Tensor&, at::Tensor&> neuron_min_dim_out(const at::Tensor& self, int64_t dim, bool keepdim,
                                                        at::Tensor& values, at::Tensor& indices) {
  NEURON_NATIVE("aten::min.dim_min");
  if (!arg_native(self, dim, keepdim, &values, &indices, false)) {
    at::Tensor v = cpu_alias(values), i = cpu_alias(indices);
    at::min_out(v, i, cpu_alias(self), dim, keepdim);
  }
  return {values, indices};
}

at::Tensor& neuron_argmax_out(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::argmax.out");
  if (!arg_native(self, dim, keepdim, nullptr, &out, true)) {
    at::Tensor o = cpu_alias(out);
    at::argmax_out(o, cpu_alias(self), dim, keepdim);
  }
  return out;
}

at::Tensor& neuron_argmin_out(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::argmin.out");
  if (!arg_native(self, dim, keepdim, nullptr, &out, false)) {
    at::Tensor o = cpu_alias(out);
    at::argmin_out(o, cpu_alias(self), dim, keepdim);
  }
  return out;
}

// ---- var / std ------------------------------------------------------------------------------------

// var (or std) and optionally the mean, as new tensors; false: use the CPU kernel.
bool var_native(const char* name, const at::Tensor& self, at::OptionalIntArrayRef dim,
                const std::optional<at::Scalar>& correction, bool keepdim, bool take_sqrt, at::Tensor* var,
                at::Tensor* mean) {
  const at::ScalarType st = self.scalar_type();
  if (!(is_half_or_float(st) || st == at::kDouble) || self.numel() == 0) return false;
  const int64_t ndim = self.dim();
  auto mask = at::native::make_dim_mask(dim, ndim);
  auto shape = at::native::shape_from_dim_mask(self, mask, keepdim);
  const uint64_t m = mask_bits(mask, ndim);
  const double corr = correction.has_value() ? correction->toDouble() : 1.0;
  *var = at::empty(shape, self.options());
  if (mean) *mean = at::empty(shape, self.options());
  if (var->numel() > 0 && static_cast<double>(self.numel() / var->numel()) - corr <= 0)
    TORCH_WARN(name, "(): degrees of freedom is <= 0. Correction should be strictly less than the reduction factor "
               "(input numel divided by output numel).");
  nk_tensor in, v, mu;
  if (!to_nk(self, &in) || !nk_keepdim(*var, ndim, m, keepdim, &v)) return false;
  if (mean && !nk_keepdim(*mean, ndim, m, keepdim, &mu)) return false;
  return ok(nk_reduce_var(&v, mean ? &mu : nullptr, &in, m, corr, take_sqrt), "var/std", self);
}

at::Tensor neuron_var(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>& correction,
                      bool keepdim) {
  NEURON_NATIVE("aten::var.correction");
  at::Tensor v;
  if (var_native("var", self, dim, correction, keepdim, false, &v, nullptr)) return v;
  return to_neuron(at::var(cpu_alias(self), dim, correction, keepdim), self.device());
}

at::Tensor neuron_std(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>& correction,
                      bool keepdim) {
  NEURON_NATIVE("aten::std.correction");
  at::Tensor v;
  if (var_native("std", self, dim, correction, keepdim, true, &v, nullptr)) return v;
  return to_neuron(at::std(cpu_alias(self), dim, correction, keepdim), self.device());
}

std::tuple<at::Tensor, at::Tensor> neuron_var_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                                   const std::optional<at::Scalar>& correction, bool keepdim) {
  NEURON_NATIVE("aten::var_mean.correction");
  at::Tensor v, m;
  if (var_native("var_mean", self, dim, correction, keepdim, false, &v, &m)) return {v, m};
  auto r = at::var_mean(cpu_alias(self), dim, correction, keepdim);
  return {to_neuron(std::get<0>(r), self.device()), to_neuron(std::get<1>(r), self.device())};
}

std::tuple<at::Tensor, at::Tensor> neuron_std_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                                   const std::optional<at::Scalar>& correction, bool keepdim) {
  NEURON_NATIVE("aten::std_mean.correction");
  at::Tensor v, m;
  if (var_native("std_mean", self, dim, correction, keepdim, true, &v, &m)) return {v, m};
  auto r = at::std_mean(cpu_alias(self), dim, correction, keepdim);
  return {to_neuron(std::get<0>(r), self.device()), to_neuron(std::get<1>(r), self.device())};
}

// var/std into an out= tensor of self's dtype; false: use the CPU kernel.
bool var_out_native(const char* name, const at::Tensor& self, at::OptionalIntArrayRef dim,
                    const std::optional<at::Scalar>& correction, bool keepdim, bool take_sqrt, at::Tensor& out) {
  const at::ScalarType st = self.scalar_type();
  if (!(is_half_or_float(st) || st == at::kDouble) || self.numel() == 0 || out.scalar_type() != st ||
      !out.is_privateuseone() || !separate(out, self))
    return false;
  const int64_t ndim = self.dim();
  auto mask = at::native::make_dim_mask(dim, ndim);
  at::native::resize_output(out, at::native::shape_from_dim_mask(self, mask, keepdim));
  const uint64_t m = mask_bits(mask, ndim);
  const double corr = correction.has_value() ? correction->toDouble() : 1.0;
  if (out.numel() > 0 && static_cast<double>(self.numel() / out.numel()) - corr <= 0)
    TORCH_WARN(name, "(): degrees of freedom is <= 0. Correction should be strictly less than the reduction factor "
               "(input numel divided by output numel).");
  nk_tensor in, v;
  if (!to_nk(self, &in) || !nk_keepdim(out, ndim, m, keepdim, &v)) return false;
  return ok(nk_reduce_var(&v, nullptr, &in, m, corr, take_sqrt), "var/std", self);
}

at::Tensor& neuron_var_out(const at::Tensor& self, at::OptionalIntArrayRef dim,
                           const std::optional<at::Scalar>& correction, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::var.correction_out");
  if (var_out_native("var", self, dim, correction, keepdim, false, out)) return out;
  return cpu_out(out, [&](at::Tensor& r) { at::var_out(r, cpu_alias(self), dim, correction, keepdim); });
}

at::Tensor& neuron_std_out(const at::Tensor& self, at::OptionalIntArrayRef dim,
                           const std::optional<at::Scalar>& correction, bool keepdim, at::Tensor& out) {
  NEURON_NATIVE("aten::std.correction_out");
  if (var_out_native("std", self, dim, correction, keepdim, true, out)) return out;
  return cpu_out(out, [&](at::Tensor& r) { at::std_out(r, cpu_alias(self), dim, correction, keepdim); });
}

// ---- cumsum ---------------------------------------------------------------------------------------

at::Tensor& neuron_cumsum_out(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype,
                              at::Tensor& out) {
  NEURON_NATIVE("aten::cumsum.out");
  const int64_t d = at::maybe_wrap_dim(dim, self.dim());
  bool done = false;
  if (!dtype || *dtype == out.scalar_type()) {
    at::native::resize_output(out, self.sizes());
    nk_tensor o, in;
    if (self.numel() > 0 && separate(out, self) && to_nk(self, &in) && to_nk(out, &o))
      done = ok(nk_cumsum(&o, &in, static_cast<int32_t>(d)), "cumsum", self);
  }
  if (!done) {
    at::Tensor o = cpu_alias(out);
    at::cumsum_out(o, cpu_alias(self), dim, dtype);
  }
  return out;
}

// ---- softmax --------------------------------------------------------------------------------------

at::Tensor& softmax_out_impl(const at::Tensor& self, int64_t dim, bool half_to_float, at::Tensor& out, bool log) {
  const int64_t d = at::maybe_wrap_dim(dim, self.dim());
  const at::ScalarType want = half_to_float ? at::kFloat : self.scalar_type();
  bool done = false;
  if (is_half_or_float(self.scalar_type()) && out.scalar_type() == want &&
      (!half_to_float || self.scalar_type() != at::kFloat)) {
    at::native::resize_output(out, self.sizes());
    nk_tensor o, in;
    if (self.numel() > 0 && (out.is_same(self) || separate(out, self)) && to_nk(self, &in) && to_nk(out, &o))
      done = ok(nk_softmax(&o, &in, static_cast<int32_t>(d), log), log ? "_log_softmax" : "_softmax", self);
  }
  if (!done) {
    at::Tensor o = cpu_alias(out);
    if (log) at::_log_softmax_out(o, cpu_alias(self), dim, half_to_float);
    else at::_softmax_out(o, cpu_alias(self), dim, half_to_float);
  }
  return out;
}

at::Tensor& neuron_softmax_out(const at::Tensor& self, int64_t dim, bool half_to_float, at::Tensor& out) {
  NEURON_NATIVE("aten::_softmax.out");
  return softmax_out_impl(self, dim, half_to_float, out, false);
}

at::Tensor& neuron_log_softmax_out(const at::Tensor& self, int64_t dim, bool half_to_float, at::Tensor& out) {
  NEURON_NATIVE("aten::_log_softmax.out");
  return softmax_out_impl(self, dim, half_to_float, out, true);
}

at::Tensor& softmax_bwd_impl(const at::Tensor& grad, const at::Tensor& output, int64_t dim, at::ScalarType input_dtype,
                             at::Tensor& grad_input, bool log) {
  bool done = false;
  if (is_half_or_float(grad.scalar_type()) && is_half_or_float(output.scalar_type()) &&
      is_half_or_float(input_dtype) && is_half_or_float(grad_input.scalar_type()) && grad.sizes() == output.sizes()) {
    const int64_t d = at::maybe_wrap_dim(dim, grad.dim());
    at::native::resize_output(grad_input, grad.sizes());
    nk_tensor gi, g, y;
    if (grad.numel() > 0 && separate(grad_input, output) && (grad_input.is_same(grad) || separate(grad_input, grad)) &&
        to_nk(grad_input, &gi) && to_nk(grad, &g) && to_nk(output, &y))
      done = ok(nk_softmax_backward(&gi, &g, &y, static_cast<int32_t>(d), log), "softmax_backward", grad);
  }
  if (!done) {
    at::Tensor o = cpu_alias(grad_input);
    if (log) at::_log_softmax_backward_data_out(o, cpu_alias(grad), cpu_alias(output), dim, input_dtype);
    else at::_softmax_backward_data_out(o, cpu_alias(grad), cpu_alias(output), dim, input_dtype);
  }
  return grad_input;
}

at::Tensor& neuron_softmax_bwd_out(const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                                   at::ScalarType input_dtype, at::Tensor& grad_input) {
  NEURON_NATIVE("aten::_softmax_backward_data.out");
  return softmax_bwd_impl(grad, output, dim, input_dtype, grad_input, false);
}

at::Tensor& neuron_log_softmax_bwd_out(const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                                       at::ScalarType input_dtype, at::Tensor& out) {
  NEURON_NATIVE("aten::_log_softmax_backward_data.out");
  return softmax_bwd_impl(grad, output, dim, input_dtype, out, true);
}

// ---- layer norm / RMS norm ------------------------------------------------------------------------

// Parameters the kernels take: x's dtype, or float for a half/bfloat16 x (PyTorch's mixed mode).
bool params_ok(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool* mixed) {
  const at::ScalarType xt = x.scalar_type();
  if (!is_half_or_float(xt)) return false;
  at::ScalarType pt = w.defined() ? w.scalar_type() : (b.defined() ? b.scalar_type() : xt);
  if (w.defined() && b.defined() && w.scalar_type() != b.scalar_type()) return false;
  if (pt != xt && !(pt == at::kFloat && xt != at::kFloat)) return false;
  *mixed = pt != xt;
  return true;
}

bool trailing_match(const at::Tensor& x, c10::IntArrayRef shape) {
  const int64_t k = static_cast<int64_t>(shape.size());
  if (k < 1 || x.dim() < k) return false;
  return x.sizes().slice(x.dim() - k).equals(shape);
}

std::vector<int64_t> stat_shape(const at::Tensor& x, int64_t axis) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().begin() + axis);
  s.resize(x.dim(), 1);
  return s;
}

nk_tensor* opt_nk(const at::Tensor& t, nk_tensor* d) {
  if (!t.defined()) return nullptr;
  TORCH_INTERNAL_ASSERT(to_nk(t, d));
  return d;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> neuron_native_layer_norm(const at::Tensor& input,
                                                                        c10::SymIntArrayRef normalized_shape_sym,
                                                                        const std::optional<at::Tensor>& weight_opt,
                                                                        const std::optional<at::Tensor>& bias_opt,
                                                                        double eps) {
  NEURON_NATIVE("aten::native_layer_norm");
  auto normalized_shape = C10_AS_INTARRAYREF_SLOW(normalized_shape_sym);
  at::Tensor w = weight_opt.has_value() ? *weight_opt : at::Tensor();
  at::Tensor b = bias_opt.has_value() ? *bias_opt : at::Tensor();
  bool mixed = false;
  if (params_ok(input, w, b, &mixed) && trailing_match(input, normalized_shape) && input.numel() > 0 &&
      (!w.defined() || w.sizes().equals(normalized_shape)) && (!b.defined() || b.sizes().equals(normalized_shape))) {
    const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
    const int64_t M = c10::multiply_integers(input.sizes().begin(), input.sizes().begin() + axis);
    const int64_t N = input.numel() / M;
    at::Tensor x = input.contiguous(), wc = w.defined() ? w.contiguous() : w, bc = b.defined() ? b.contiguous() : b;
    at::Tensor y = at::empty(input.sizes(), input.options());
    auto sopt = input.options().dtype(mixed ? at::kFloat : input.scalar_type());
    at::Tensor mean = at::empty(stat_shape(input, axis), sopt), rstd = at::empty(stat_shape(input, axis), sopt);
    nk_tensor ty, tm, tr, tx, tw, tb;
    to_nk(y, &ty), to_nk(mean, &tm), to_nk(rstd, &tr), to_nk(x, &tx);
    if (ok(nk_layer_norm(&ty, &tm, &tr, &tx, opt_nk(wc, &tw), opt_nk(bc, &tb), M, N, eps), "native_layer_norm",
           input))
      return {y, mean, rstd};
  }
  auto r = at::native_layer_norm(cpu_alias(input), normalized_shape, alias_or_undef(weight_opt),
                                 alias_or_undef(bias_opt), eps);
  const auto dev = input.device();
  return {to_neuron(std::get<0>(r), dev), to_neuron(std::get<1>(r), dev), to_neuron(std::get<2>(r), dev)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> neuron_native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape_sym,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight_opt,
    const std::optional<at::Tensor>& bias_opt, std::array<bool, 3> mask) {
  NEURON_NATIVE("aten::native_layer_norm_backward");
  auto normalized_shape = C10_AS_INTARRAYREF_SLOW(normalized_shape_sym);
  at::Tensor w = weight_opt.has_value() ? *weight_opt : at::Tensor();
  at::Tensor b = bias_opt.has_value() ? *bias_opt : at::Tensor();
  bool mixed = false;
  if (params_ok(input, w, b, &mixed) && trailing_match(input, normalized_shape) && input.numel() > 0 &&
      grad_out.sizes() == input.sizes() && grad_out.scalar_type() == input.scalar_type() &&
      (!mask[1] || w.defined()) && (!mask[2] || b.defined()) &&
      (!w.defined() || w.sizes().equals(normalized_shape)) && is_half_or_float(mean.scalar_type()) &&
      is_half_or_float(rstd.scalar_type())) {
    const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
    const int64_t M = c10::multiply_integers(input.sizes().begin(), input.sizes().begin() + axis);
    const int64_t N = input.numel() / M;
    if (mean.numel() == M && rstd.numel() == M) {
      at::Tensor x = input.contiguous(), dy = grad_out.contiguous(), wc = w.defined() ? w.contiguous() : w;
      at::Tensor mc = mean.contiguous(), rc = rstd.contiguous();
      at::Tensor dx, dw, db;
      if (mask[0]) dx = at::empty(input.sizes(), input.options());
      if (mask[1]) dw = at::empty(w.sizes(), w.options());
      if (mask[2]) db = at::empty(b.sizes(), b.options());
      nk_tensor tdx, tdw, tdb, tdy, tx, tm, tr, tw;
      to_nk(dy, &tdy), to_nk(x, &tx), to_nk(mc, &tm), to_nk(rc, &tr);
      if (ok(nk_layer_norm_backward(opt_nk(dx, &tdx), opt_nk(dw, &tdw), opt_nk(db, &tdb), &tdy, &tx, &tm, &tr,
                                    opt_nk(wc, &tw), M, N),
             "native_layer_norm_backward", input))
        return {dx, dw, db};
    }
  }
  auto r = at::native_layer_norm_backward(cpu_alias(grad_out), cpu_alias(input), normalized_shape, cpu_alias(mean),
                                          cpu_alias(rstd), alias_or_undef(weight_opt), alias_or_undef(bias_opt), mask);
  const auto dev = input.device();
  return {to_neuron(std::get<0>(r), dev), to_neuron(std::get<1>(r), dev), to_neuron(std::get<2>(r), dev)};
}

std::tuple<at::Tensor, at::Tensor> neuron_fused_rms_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                         const std::optional<at::Tensor>& weight_opt,
                                                         std::optional<double> eps) {
  NEURON_NATIVE("aten::_fused_rms_norm");
  at::Tensor w = weight_opt.has_value() ? *weight_opt : at::Tensor();
  bool mixed = false;
  if (params_ok(input, w, at::Tensor(), &mixed) && trailing_match(input, normalized_shape) && input.numel() > 0 &&
      (!w.defined() || w.sizes().equals(normalized_shape))) {
    const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
    const int64_t M = c10::multiply_integers(input.sizes().begin(), input.sizes().begin() + axis);
    const int64_t N = input.numel() / M;
    at::Tensor x = input.contiguous(), wc = w.defined() ? w.contiguous() : w;
    at::Tensor y = at::empty(input.sizes(), input.options());
    at::Tensor rstd = at::empty(stat_shape(input, axis), input.options().dtype(at::kFloat));
    nk_tensor ty, tr, tx, tw;
    to_nk(y, &ty), to_nk(rstd, &tr), to_nk(x, &tx);
    // PyTorch's default eps is the epsilon of the computation dtype (float here).
    if (ok(nk_rms_norm(&ty, &tr, &tx, opt_nk(wc, &tw), M, N, eps.value_or(FLT_EPSILON)), "_fused_rms_norm", input))
      return {y, rstd};
  }
  auto r = at::_fused_rms_norm(cpu_alias(input), normalized_shape, alias_or_undef(weight_opt), eps);
  return {to_neuron(std::get<0>(r), input.device()), to_neuron(std::get<1>(r), input.device())};
}

std::tuple<at::Tensor, at::Tensor> neuron_fused_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                                  at::IntArrayRef normalized_shape,
                                                                  const at::Tensor& rstd,
                                                                  const std::optional<at::Tensor>& weight_opt,
                                                                  std::array<bool, 2> mask) {
  NEURON_NATIVE("aten::_fused_rms_norm_backward");
  at::Tensor w = weight_opt.has_value() ? *weight_opt : at::Tensor();
  bool mixed = false;
  if (!(params_ok(input, w, at::Tensor(), &mixed) && trailing_match(input, normalized_shape) &&
        grad_out.sizes() == input.sizes() && is_half_or_float(grad_out.scalar_type()) &&
        is_half_or_float(rstd.scalar_type()) && (!w.defined() || w.sizes().equals(normalized_shape)))) {
    // No CPU kernel exists for this op: PyTorch's decomposition, on the CPU aliases.
    const auto dev = input.device();
    const at::ScalarType ct = at::toOpMathType(input.scalar_type());
    const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
    std::vector<int64_t> inner, outer;
    for (int64_t d = 0; d < input.dim(); ++d) (d >= axis ? inner : outer).push_back(d);
    at::Tensor x = cpu_alias(input).to(ct), g = cpu_alias(grad_out).to(ct), r = cpu_alias(rstd).to(ct);
    while (r.dim() < x.dim()) r = r.unsqueeze(-1);
    at::Tensor xh = x * r, gx = w.defined() ? g * cpu_alias(w).to(ct) : g;
    at::Tensor dx, dw;
    if (mask[0]) {
      const double n = static_cast<double>(c10::multiply_integers(normalized_shape));
      dx = to_neuron(((gx - (xh / n) * (xh * gx).sum(inner, true)) * r).to(input.scalar_type()), dev);
    }
    if (mask[1] && w.defined()) {
      at::Tensor full = g * xh;
      dw = to_neuron((outer.empty() ? full : full.sum(outer)).to(w.scalar_type()), dev);
    }
    return {dx, dw};
  }
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  const int64_t M = c10::multiply_integers(input.sizes().begin(), input.sizes().begin() + axis);
  const int64_t N = c10::multiply_integers(normalized_shape);
  TORCH_CHECK(rstd.numel() == M, "_fused_rms_norm_backward: rstd has ", rstd.numel(), " elements, expected ", M);
  at::Tensor dx, dw;
  if (mask[0]) dx = at::empty(input.sizes(), input.options());
  if (mask[1] && w.defined()) dw = at::empty(w.sizes(), w.options());
  if (M * N == 0) {
    if (dx.defined()) dx.zero_();
    if (dw.defined()) dw.zero_();
    return {dx, dw};
  }
  at::Tensor dy = grad_out.scalar_type() == input.scalar_type() ? grad_out.contiguous()
                                                                 : grad_out.to(input.scalar_type()).contiguous();
  at::Tensor x = input.contiguous(), rc = rstd.contiguous(), wc = w.defined() ? w.contiguous() : w;
  nk_tensor tdx, tdw, tdy, tx, tr, tw;
  to_nk(dy, &tdy), to_nk(x, &tx), to_nk(rc, &tr);
  nk_status s = nk_rms_norm_backward(opt_nk(dx, &tdx), opt_nk(dw, &tdw), &tdy, &tx, &tr, opt_nk(wc, &tw), M, N);
  if (s != NK_SUCCESS) raise_kernel_status(s, "_fused_rms_norm_backward", input);
  return {dx, dw};
}

// ---- group norm -----------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor, at::Tensor> neuron_native_group_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight_opt, const std::optional<at::Tensor>& bias_opt,
    c10::SymInt N_, c10::SymInt C_, c10::SymInt HxW_, int64_t group, double eps) {
  NEURON_NATIVE("aten::native_group_norm");
  const int64_t N = N_.expect_int(), C = C_.expect_int(), HxW = HxW_.expect_int();
  at::Tensor w = weight_opt.has_value() ? *weight_opt : at::Tensor();
  at::Tensor b = bias_opt.has_value() ? *bias_opt : at::Tensor();
  bool mixed = false;
  if (params_ok(input, w, b, &mixed) && input.is_contiguous() && input.numel() > 0 && input.numel() == N * C * HxW &&
      input.dim() >= 2 && input.size(0) == N && input.size(1) == C && group > 0 && C % group == 0 &&
      (!w.defined() || (w.dim() == 1 && w.numel() == C)) && (!b.defined() || (b.dim() == 1 && b.numel() == C))) {
    at::Tensor wc = w.defined() ? w.contiguous() : w, bc = b.defined() ? b.contiguous() : b;
    at::Tensor y = at::empty(input.sizes(), input.options());
    auto sopt = input.options().dtype(mixed ? at::kFloat : input.scalar_type());
    at::Tensor mean = at::empty({N, group}, sopt), rstd = at::empty({N, group}, sopt);
    nk_tensor ty, tm, tr, tx, tw, tb;
    to_nk(y, &ty), to_nk(mean, &tm), to_nk(rstd, &tr), to_nk(input, &tx);
    if (ok(nk_group_norm(&ty, &tm, &tr, &tx, opt_nk(wc, &tw), opt_nk(bc, &tb), N, C, HxW, group, eps),
           "native_group_norm", input))
      return {y, mean, rstd};
  }
  auto r = at::native_group_norm(cpu_alias(input), alias_or_undef(weight_opt), alias_or_undef(bias_opt), N, C, HxW,
                                 group, eps);
  const auto dev = input.device();
  return {to_neuron(std::get<0>(r), dev), to_neuron(std::get<1>(r), dev), to_neuron(std::get<2>(r), dev)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> neuron_native_group_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight_opt, c10::SymInt N_, c10::SymInt C_, c10::SymInt HxW_, int64_t group,
    std::array<bool, 3> mask) {
  NEURON_NATIVE("aten::native_group_norm_backward");
  const int64_t N = N_.expect_int(), C = C_.expect_int(), HxW = HxW_.expect_int();
  at::Tensor w = weight_opt.has_value() ? *weight_opt : at::Tensor();
  bool mixed = false;
  if (params_ok(input, w, at::Tensor(), &mixed) && input.numel() > 0 && input.numel() == N * C * HxW &&
      grad_out.sizes() == input.sizes() && grad_out.scalar_type() == input.scalar_type() && group > 0 &&
      C % group == 0 && ((!mask[1] && !mask[2]) || w.defined()) && (!w.defined() || w.numel() == C) &&
      mean.numel() == N * group && rstd.numel() == N * group && is_half_or_float(mean.scalar_type()) &&
      is_half_or_float(rstd.scalar_type())) {
    at::Tensor x = input.contiguous(), dy = grad_out.contiguous(), wc = w.defined() ? w.contiguous() : w;
    at::Tensor mc = mean.contiguous(), rc = rstd.contiguous();
    at::Tensor dx, dw, db;
    if (mask[0]) dx = at::empty(input.sizes(), input.options());
    if (mask[1]) dw = at::empty(w.sizes(), w.options());
    if (mask[2]) db = at::empty(w.sizes(), w.options());
    nk_tensor tdx, tdw, tdb, tdy, tx, tm, tr, tw;
    to_nk(dy, &tdy), to_nk(x, &tx), to_nk(mc, &tm), to_nk(rc, &tr);
    if (ok(nk_group_norm_backward(opt_nk(dx, &tdx), opt_nk(dw, &tdw), opt_nk(db, &tdb), &tdy, &tx, &tm, &tr,
                                  opt_nk(wc, &tw), N, C, HxW, group),
           "native_group_norm_backward", input))
      return {dx, dw, db};
  }
  auto r = at::native_group_norm_backward(cpu_alias(grad_out), cpu_alias(input), cpu_alias(mean), cpu_alias(rstd),
                                          alias_or_undef(weight_opt), N, C, HxW, group, mask);
  const auto dev = input.device();
  return {to_neuron(std::get<0>(r), dev), to_neuron(std::get<1>(r), dev), to_neuron(std::get<2>(r), dev)};
}

// ---- nll_loss -------------------------------------------------------------------------------------

bool nll_args_ok(const at::Tensor& self, const at::Tensor& target, const at::Tensor& weight) {
  if (!at::isFloatingType(self.scalar_type()) || target.scalar_type() != at::kLong) return false;
  if (self.dim() < 1 || self.dim() > 2 || target.dim() != self.dim() - 1) return false;
  if (self.dim() == 2 && target.size(0) != self.size(0)) return false;
  if (weight.defined() && (weight.dim() != 1 || weight.numel() != self.size(-1) ||
                           !at::isFloatingType(weight.scalar_type())))
    return false;
  return true;
}

std::tuple<at::Tensor&, at::Tensor&> neuron_nll_loss_forward_out(const at::Tensor& self, const at::Tensor& target,
                                                                 const std::optional<at::Tensor>& weight_opt,
                                                                 int64_t reduction, c10::SymInt ignore_index_,
                                                                 at::Tensor& output, at::Tensor& total_weight) {
  NEURON_NATIVE("aten::nll_loss_forward.output");
  const int64_t ignore_index = ignore_index_.expect_int();
  at::Tensor w = weight_opt.has_value() ? *weight_opt : at::Tensor();
  bool done = false;
  if (nll_args_ok(self, target, w) && output.scalar_type() == self.scalar_type() &&
      total_weight.scalar_type() == self.scalar_type()) {
    if (reduction == at::Reduction::None && self.dim() == 2) at::native::resize_output(output, {self.size(0)});
    else at::native::resize_output(output, {});
    at::native::resize_output(total_weight, {});
    nk_tensor to, ttw, ts, tt, tw;
    int64_t bad = INT64_MIN;
    if (separate(output, self) && separate(total_weight, self) && to_nk(output, &to) && to_nk(total_weight, &ttw) &&
        to_nk(self, &ts) && to_nk(target, &tt) && (!w.defined() || to_nk(w, &tw))) {
      nk_status s = nk_nll_loss(&to, &ttw, &ts, &tt, w.defined() ? &tw : nullptr, static_cast<int32_t>(reduction),
                                ignore_index, &bad);
      TORCH_CHECK_INDEX(!(s == NK_INVALID && bad != INT64_MIN), "Target ", bad, " is out of bounds.");
      done = s == NK_SUCCESS;
    }
  }
  if (!done) {
    at::Tensor o = cpu_alias(output), t = cpu_alias(total_weight);
    at::nll_loss_forward_out(o, t, cpu_alias(self), cpu_alias(target), alias_or_undef(weight_opt), reduction,
                             ignore_index);
  }
  return {output, total_weight};
}

at::Tensor& neuron_nll_loss_backward_out(const at::Tensor& grad_output, const at::Tensor& self,
                                         const at::Tensor& target, const std::optional<at::Tensor>& weight_opt,
                                         int64_t reduction, c10::SymInt ignore_index_, const at::Tensor& total_weight,
                                         at::Tensor& grad_input) {
  NEURON_NATIVE("aten::nll_loss_backward.grad_input");
  const int64_t ignore_index = ignore_index_.expect_int();
  at::Tensor w = weight_opt.has_value() ? *weight_opt : at::Tensor();
  bool done = false;
  if (nll_args_ok(self, target, w) && grad_input.scalar_type() == self.scalar_type() &&
      at::isFloatingType(grad_output.scalar_type()) && at::isFloatingType(total_weight.scalar_type()) &&
      total_weight.numel() == 1) {
    at::native::resize_output(grad_input, self.sizes());
    nk_tensor tgi, tgo, tt, tw, ttw;
    int64_t bad = INT64_MIN;
    if (separate(grad_input, grad_output) && separate(grad_input, target) && to_nk(grad_input, &tgi) &&
        to_nk(grad_output, &tgo) && to_nk(target, &tt) && to_nk(total_weight, &ttw) &&
        (!w.defined() || to_nk(w, &tw))) {
      nk_status s = nk_nll_loss_backward(&tgi, &tgo, &tt, w.defined() ? &tw : nullptr, static_cast<int32_t>(reduction),
                                         ignore_index, &ttw, &bad);
      TORCH_CHECK_INDEX(!(s == NK_INVALID && bad != INT64_MIN), "Target ", bad, " is out of bounds.");
      done = s == NK_SUCCESS;
    }
  }
  if (!done) {
    at::Tensor gi = cpu_alias(grad_input);
    at::nll_loss_backward_out(gi, cpu_alias(grad_output), cpu_alias(self), cpu_alias(target),
                              alias_or_undef(weight_opt), reduction, ignore_index, cpu_alias(total_weight));
  }
  return grad_input;
}

}  // namespace
}  // namespace torch_neuronx

using namespace torch_neuronx;

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("sum.IntList_out", neuron_sum_out);
  m.impl("mean.out", neuron_mean_out);
  m.impl("amax.out", neuron_amax_out);
  m.impl("amin.out", neuron_amin_out);
  m.impl("any.out", neuron_any_out);
  m.impl("any.dims_out", neuron_any_dims_out);
  m.impl("any.all_out", neuron_any_all_out);
  m.impl("all.out", neuron_all_out);
  m.impl("all.dims_out", neuron_all_dims_out);
  m.impl("all.all_out", neuron_all_all_out);
  m.impl("logsumexp", neuron_logsumexp);
  m.impl("logsumexp.out", neuron_logsumexp_out);
  m.impl("max.unary_out", neuron_max_unary_out);
  m.impl("min.unary_out", neuron_min_unary_out);
  m.impl("var.correction_out", neuron_var_out);
  m.impl("std.correction_out", neuron_std_out);
  m.impl("max", neuron_max_all);
  m.impl("min", neuron_min_all);
  m.impl("max.dim_max", neuron_max_dim_out);
  m.impl("min.dim_min", neuron_min_dim_out);
  m.impl("argmax.out", neuron_argmax_out);
  m.impl("argmin.out", neuron_argmin_out);
  m.impl("var.correction", neuron_var);
  m.impl("std.correction", neuron_std);
  m.impl("var_mean.correction", neuron_var_mean);
  m.impl("std_mean.correction", neuron_std_mean);
  m.impl("cumsum.out", neuron_cumsum_out);
  m.impl("_softmax.out", neuron_softmax_out);
  m.impl("_log_softmax.out", neuron_log_softmax_out);
  m.impl("_softmax_backward_data.out", neuron_softmax_bwd_out);
  m.impl("_log_softmax_backward_data.out", neuron_log_softmax_bwd_out);
  m.impl("native_layer_norm", neuron_native_layer_norm);
  m.impl("native_layer_norm_backward", neuron_native_layer_norm_backward);
  m.impl("_fused_rms_norm", neuron_fused_rms_norm);
  m.impl("_fused_rms_norm_backward", neuron_fused_rms_norm_backward);
  m.impl("native_group_norm", neuron_native_group_norm);
  m.impl("native_group_norm_backward", neuron_native_group_norm_backward);
  m.impl("nll_loss_forward.output", neuron_nll_loss_forward_out);
  m.impl("nll_loss_backward.grad_input", neuron_nll_loss_backward_out);
}
