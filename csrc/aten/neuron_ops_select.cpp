// Selection and position-dependent operators on neuron: sort, topk, median along a dim, isin, nonzero,
// tril/triu, arange, advanced indexing (x[i, j] and its assignment, accumulate included), bound to kernels/sort.c,
// layout.c and index.c.
//
// Every op declines (dtype, layout, overlapping out=, an index out of range, any input PyTorch rejects)
// by running the CPU kernel on aliases of the same memory, so results and errors equal the CPU's. The
// kernels check their inputs before writing, so the CPU rerun sees the tensors untouched.
#include "aten/neuron_aten.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <cmath>
#include <cstdlib>
#include <limits>

namespace torch_neuronx {
namespace {

at::Tensor host(const at::Tensor& t) { return t.is_privateuseone() ? cpu_alias(t) : t; }

bool separate(const at::Tensor& a, const at::Tensor& b) {
  return !a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0 ||
         at::get_overlap_status(a, b) == at::MemOverlapStatus::No;
}

// Dtypes that the CPU's topk, isin, nonzero, tril/triu and arange accept (sort and indexing take more).
bool common_dtype(at::ScalarType t) {
  switch (t) {
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble:
      return true;
    default:
      return false;
  }
}

// A CPU result copied into a neuron out= tensor (the fallback of ops that resize their outputs).
void assign(at::Tensor& out, const at::Tensor& r) {
  if (!out.sizes().equals(r.sizes())) out.resize_(r.sizes());
  if (r.numel()) cpu_alias(out).copy_(r);
}

// A CPU tensor shaped and typed like an out= tensor: the CPU's out= kernel run into it makes the CPU's
// dtype checks and resize warnings.
at::Tensor cpu_like(const at::Tensor& out) { return at::empty(out.sizes(), out.options().device(at::kCPU)); }

// ---- arange ---------------------------------------------------------------------------------------

// Integral start/end/step whose values the out dtype holds exactly: then every evaluation order the
// CPU kernel may use (int64, double, float lanes) gives the same numbers and element count.
bool arange_native(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, at::Tensor& out) {
  const at::ScalarType dt = out.scalar_type();
  if (!common_dtype(dt) || !start.isIntegral(false) || !end.isIntegral(false) || !step.isIntegral(false))
    return false;
  const int64_t a = start.toLong(), b = end.toLong(), s = step.toLong();
  const int64_t lim = int64_t{1} << 40;
  if (s == 0 || a < -lim || a > lim || b < -lim || b > lim || s < -lim || s > lim) return false;
  if ((s > 0 && b < a) || (s < 0 && b > a)) return false;
  const int64_t span = s > 0 ? b - a : a - b, st = s > 0 ? s : -s;
  const int64_t size = (span + st - 1) / st;
  if (at::isFloatingType(dt)) {
    const int bits = dt == at::kDouble ? 53 : dt == at::kFloat ? 24 : dt == at::kHalf ? 11 : 8;
    const int64_t exact = int64_t{1} << bits, last = size ? a + (size - 1) * s : a;
    if (std::llabs(a) > exact || std::llabs(last) > exact) return false;
  }
  // The CPU keeps an out= tensor of the right element count as it is and warns when it resizes one
  // that is not empty: those cases run the CPU kernel.
  if (out.dim() == 1 && out.numel() == size) {
  } else if (out.numel() == 0 && size > 0) {
    out.resize_({size});
  } else {
    return false;
  }
  nk_tensor o;
  return to_nk(out, &o) && (size == 0 || nk_arange(&o, a, s) == NK_SUCCESS);
}

at::Tensor& neuron_arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step,
                              at::Tensor& out) {
  NEURON_NATIVE("aten::arange.start_out");
  if (arange_native(start, end, step, out)) return out;
  at::Tensor r = at::empty(out.sizes(), out.options().device(at::kCPU));
  at::arange_out(r, start, end, step);
  assign(out, r);
  return out;
}

// ---- sort / topk ----------------------------------------------------------------------------------

bool sort_outputs_ok(const at::Tensor& self, const at::Tensor& values, const at::Tensor& indices) {
  return values.scalar_type() == self.scalar_type() && indices.scalar_type() == at::kLong &&
         values.is_privateuseone() && indices.is_privateuseone() && separate(values, self) &&
         separate(indices, self) && separate(values, indices);
}

bool sort_native(const at::Tensor& self, int64_t dim, bool descending, bool is_topk, int64_t k, bool largest,
                 at::Tensor& values, at::Tensor& indices, bool stable = true) {
  const int64_t ndim = self.dim();
  if (dim < -std::max<int64_t>(ndim, 1) || dim >= std::max<int64_t>(ndim, 1)) return false;
  const int32_t d = static_cast<int32_t>(at::maybe_wrap_dim(dim, ndim));
  const int64_t size = ndim ? self.size(d) : 1;
  if (is_topk && (k < 0 || k > size)) return false;
  if (!sort_outputs_ok(self, values, indices)) return false;
  std::vector<int64_t> shape = self.sizes().vec();
  if (is_topk && ndim) shape[d] = k;
  at::native::resize_output(values, shape);
  at::native::resize_output(indices, shape);
  nk_tensor tv, ti, in;
  if (!to_nk(self, &in) || !to_nk(values, &tv) || !to_nk(indices, &ti)) return false;
  // Non-stable sorts follow the CPU's tie order: its introsort for the dtypes it sorts that way; for
  // the ones it sorts with a vectorised quicksort the stable order is the nearest (ties rarely differ).
  const at::ScalarType dt = self.scalar_type();
  // A dim of stride 0 (expanded) the CPU leaves in index order.
  const bool intro = !stable && dt != at::kFloat && dt != at::kDouble && dt != at::kInt && dt != at::kLong &&
                     (ndim == 0 || self.stride(d) != 0);
  const nk_status st = is_topk ? nk_topk(&tv, &ti, &in, d, k, largest)
                       : intro ? nk_sort_unstable(&tv, &ti, &in, d, descending)
                               : nk_sort(&tv, &ti, &in, d, descending);
  return st == NK_SUCCESS;
}

std::tuple<at::Tensor&, at::Tensor&> neuron_sort_out(const at::Tensor& self, std::optional<bool> stable, int64_t dim,
                                                     bool descending, at::Tensor& values, at::Tensor& indices) {
  NEURON_NATIVE("aten::sort.values_stable");
  if (!sort_native(self, dim, descending, false, 0, false, values, indices, stable.value_or(false))) {
    at::Tensor v = cpu_like(values), i = cpu_like(indices);
    at::sort_out(v, i, host(self), stable, dim, descending);
    assign(values, v);
    assign(indices, i);
  }
  return {values, indices};
}

std::tuple<at::Tensor&, at::Tensor&> neuron_topk_out(const at::Tensor& self, c10::SymInt k, int64_t dim, bool largest,
                                                     bool sorted, at::Tensor& values, at::Tensor& indices) {
  NEURON_NATIVE("aten::topk.values");
  // Always sorted (sorted=False leaves the order unspecified); ties in input order.
  const int64_t kk = k.expect_int();
  if (!common_dtype(self.scalar_type()) || !sort_native(self, dim, false, true, kk, largest, values, indices)) {
    at::Tensor v = cpu_like(values), i = cpu_like(indices);
    at::topk_out(v, i, host(self), kk, dim, largest, sorted);
    assign(values, v);
    assign(indices, i);
  }
  return {values, indices};
}

// ---- median / nanmedian along a dim ----------------------------------------------------------------

// PyTorch's CPU kernel returns uninitialised values when the reduced dimension has stride 0 (an
// expanded input); such an input runs on a contiguous copy, any other as it is.
std::tuple<at::Tensor&, at::Tensor&> median_dim_out(bool nan, const at::Tensor& self, int64_t dim, bool keepdim,
                                                    at::Tensor& values, at::Tensor& indices) {
  at::Tensor in = host(self);
  const int64_t nd = self.dim();
  if (nd > 0 && dim >= -nd && dim < nd) {
    const int64_t d = dim < 0 ? dim + nd : dim;
    if (self.stride(d) == 0 && self.size(d) > 1) in = in.contiguous();
  }
  at::Tensor v = cpu_like(values), i = cpu_like(indices);
  if (nan)
    at::nanmedian_out(v, i, in, dim, keepdim);
  else
    at::median_out(v, i, in, dim, keepdim);
  assign(values, v);
  assign(indices, i);
  return {values, indices};
}

std::tuple<at::Tensor&, at::Tensor&> neuron_median_dim_out(const at::Tensor& self, int64_t dim, bool keepdim,
                                                           at::Tensor& values, at::Tensor& indices) {
  NEURON_NATIVE("aten::median.dim_values");
  return median_dim_out(false, self, dim, keepdim, values, indices);
}

std::tuple<at::Tensor&, at::Tensor&> neuron_nanmedian_dim_out(const at::Tensor& self, int64_t dim, bool keepdim,
                                                              at::Tensor& values, at::Tensor& indices) {
  NEURON_NATIVE("aten::nanmedian.dim_values");
  return median_dim_out(true, self, dim, keepdim, values, indices);
}

// ---- isin -----------------------------------------------------------------------------------------

at::Tensor& neuron_isin_out(const at::Tensor& elements, const at::Tensor& test, bool assume_unique, bool invert,
                            at::Tensor& out) {
  NEURON_NATIVE("aten::isin.Tensor_Tensor_out");
  bool done = false;
  if (common_dtype(elements.scalar_type()) && test.scalar_type() == elements.scalar_type() &&
      out.scalar_type() == at::kBool && out.is_privateuseone() && separate(out, elements) && separate(out, test)) {
    at::native::resize_output(out, elements.sizes());
    nk_tensor to, te, tt;
    done = to_nk(out, &to) && to_nk(elements, &te) && to_nk(test, &tt) && nk_isin(&to, &te, &tt, invert) == NK_SUCCESS;
  }
  if (!done) {
    at::Tensor r = cpu_like(out);
    at::isin_out(r, host(elements), host(test), assume_unique, invert);
    assign(out, r);
  }
  return out;
}

// ---- nonzero --------------------------------------------------------------------------------------

bool nonzero_native(const at::Tensor& self, at::Tensor& out) {
  if (!common_dtype(self.scalar_type()) && self.scalar_type() != at::kBool) return false;
  if (self.numel() > std::numeric_limits<int32_t>::max() || out.scalar_type() != at::kLong ||
      !out.is_privateuseone() || !separate(out, self))
    return false;
  nk_tensor in, to;
  int64_t count = 0;
  if (!to_nk(self, &in) || nk_nonzero_count(&in, &count) != NK_SUCCESS) return false;
  at::native::resize_output(out, {count, self.dim()});
  return to_nk(out, &to) && nk_nonzero(&to, &in) == NK_SUCCESS;
}

at::Tensor neuron_nonzero(const at::Tensor& self) {
  NEURON_NATIVE("aten::nonzero");
  at::Tensor out = at::empty({0}, self.options().dtype(at::kLong));
  if (!nonzero_native(self, out)) assign(out, at::nonzero(host(self)));
  return out;
}

at::Tensor& neuron_nonzero_out(const at::Tensor& self, at::Tensor& out) {
  NEURON_NATIVE("aten::nonzero.out");
  if (!nonzero_native(self, out)) {
    at::Tensor r = at::empty({0}, out.options().device(at::kCPU));
    at::nonzero_out(r, host(self));  // raises the CPU's error for a wrong out dtype
    assign(out, r);
  }
  return out;
}

// ---- tril / triu ----------------------------------------------------------------------------------

at::Tensor& triangle_out(const at::Tensor& self, int64_t k, at::Tensor& out, bool upper) {
  bool done = false;
  if (self.dim() >= 2 && (common_dtype(self.scalar_type()) || self.scalar_type() == at::kBool) &&
      out.scalar_type() == self.scalar_type() && out.is_privateuseone()) {
    at::native::resize_output(out, self.sizes());
    const bool in_place = out.is_same(self) || (out.data_ptr() == self.data_ptr() && out.strides() == self.strides());
    nk_tensor to, in;
    if ((in_place || separate(out, self)) && to_nk(out, &to) && to_nk(self, &in))
      done = nk_triangle(&to, &in, k, upper) == NK_SUCCESS;
  }
  if (!done) {
    at::Tensor r = cpu_like(out);
    if (upper) at::triu_out(r, host(self), k);
    else at::tril_out(r, host(self), k);
    assign(out, r);
  }
  return out;
}

at::Tensor& neuron_tril_out(const at::Tensor& self, c10::SymInt k, at::Tensor& out) {
  NEURON_NATIVE("aten::tril.out");
  return triangle_out(self, k.expect_int(), out, false);
}

at::Tensor& neuron_triu_out(const at::Tensor& self, c10::SymInt k, at::Tensor& out) {
  NEURON_NATIVE("aten::triu.out");
  return triangle_out(self, k.expect_int(), out, true);
}

// ---- advanced indexing ----------------------------------------------------------------------------

// self and the index tensors as the kernels take them: `first` and the adjacent indexed dims, every
// index broadcast to one shape. Bool masks become the columns of their nonzero(), as the CPU does.
// False when the CPU must run (uint8 masks, which warn; bad shapes, which raise).
struct AdvIndex {
  at::Tensor self;
  std::vector<at::Tensor> indices;
  int32_t first = 0;
  std::vector<int64_t> shape;  // of the indexed result
};

bool adv_index(const at::Tensor& self_in, const c10::List<std::optional<at::Tensor>>& list, AdvIndex* a) {
  std::vector<at::Tensor> idx;  // one entry per dim of self (undefined: not indexed)
  for (const std::optional<at::Tensor>& o : list) {
    if (!o.has_value() || !o->defined()) {
      idx.emplace_back();
      continue;
    }
    const at::Tensor& t = *o;
    if (t.scalar_type() == at::kBool) {
      const int64_t at_dim = static_cast<int64_t>(idx.size());
      if (at_dim + t.dim() > self_in.dim()) return false;
      for (int64_t j = 0; j < t.dim(); ++j)
        if (t.size(j) != self_in.size(at_dim + j)) return false;
      at::Tensor nz = at::nonzero(t);
      for (int64_t j = 0; j < t.dim(); ++j) idx.push_back(nz.select(1, j));
    } else if (t.scalar_type() == at::kLong || t.scalar_type() == at::kInt) {
      idx.push_back(t);
    } else {
      return false;
    }
  }
  if (static_cast<int64_t>(idx.size()) > self_in.dim()) return false;
  while (static_cast<int64_t>(idx.size()) < self_in.dim()) idx.emplace_back();
  std::vector<int64_t> defined;
  for (size_t i = 0; i < idx.size(); ++i)
    if (idx[i].defined()) defined.push_back(static_cast<int64_t>(i));
  if (defined.empty()) return false;
  at::DimVector b;
  try {
    b = idx[defined[0]].sizes();
    for (int64_t i : defined) b = at::infer_size_dimvector(b, idx[i].sizes());
  } catch (const std::exception&) {
    return false;
  }
  const bool adjacent = defined.back() - defined.front() + 1 == static_cast<int64_t>(defined.size());
  at::Tensor self = self_in;
  if (adjacent) {
    a->first = static_cast<int32_t>(defined.front());
  } else {
    // Indexed dims go to the front, as the CPU's transposeToFront.
    std::vector<int64_t> perm = defined;
    for (int64_t i = 0; i < self.dim(); ++i)
      if (!idx[i].defined()) perm.push_back(i);
    self = self.permute(perm);
    a->first = 0;
  }
  a->self = self;
  for (int64_t i : defined) a->indices.push_back(idx[i].expand(b));
  const int64_t n = static_cast<int64_t>(defined.size());
  a->shape.assign(self.sizes().begin(), self.sizes().begin() + a->first);
  a->shape.insert(a->shape.end(), b.begin(), b.end());
  a->shape.insert(a->shape.end(), self.sizes().begin() + a->first + n, self.sizes().end());
  return true;
}

bool index_descs(const AdvIndex& a, std::vector<nk_tensor>* descs, std::vector<const nk_tensor*>* ptrs) {
  descs->resize(a.indices.size());
  for (size_t i = 0; i < a.indices.size(); ++i)
    if (!to_nk(a.indices[i], &(*descs)[i])) return false;
  for (auto& d : *descs) ptrs->push_back(&d);
  return true;
}

std::vector<std::optional<at::Tensor>> host_list(const c10::List<std::optional<at::Tensor>>& list) {
  std::vector<std::optional<at::Tensor>> v;
  for (const std::optional<at::Tensor>& o : list) {
    if (o.has_value() && o->defined()) v.emplace_back(host(*o));
    else v.emplace_back(std::nullopt);
  }
  return v;
}

bool index_native(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& list, at::Tensor& out) {
  if (out.scalar_type() != self.scalar_type() || !out.is_privateuseone() || !separate(out, self)) return false;
  AdvIndex a;
  if (!adv_index(self, list, &a)) return false;
  for (const at::Tensor& i : a.indices)
    if (!separate(out, i)) return false;
  at::native::resize_output(out, a.shape);
  nk_tensor to, ts;
  std::vector<nk_tensor> descs;
  std::vector<const nk_tensor*> ptrs;
  if (!to_nk(out, &to) || !to_nk(a.self, &ts) || !index_descs(a, &descs, &ptrs)) return false;
  int64_t bad = INT64_MIN;
  int32_t bad_dim = -1;
  return nk_index_gather(&to, &ts, a.first, static_cast<int32_t>(ptrs.size()), ptrs.data(), &bad, &bad_dim) ==
         NK_SUCCESS;
}

at::Tensor& neuron_index_out(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                             at::Tensor& out) {
  NEURON_NATIVE("aten::index.Tensor_out");
  if (!index_native(self, indices, out)) {
    c10::List<std::optional<at::Tensor>> l(host_list(indices));
    at::Tensor r = cpu_like(out);
    at::index_out(r, host(self), l);
    assign(out, r);
  }
  return out;
}

bool index_put_native(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& list, const at::Tensor& values,
                      bool accumulate) {
  if (values.scalar_type() != self.scalar_type() || !separate(self, values)) return false;
  // A neuron self with values elsewhere than neuron or a CPU scalar: the CPU raises.
  if (!values.is_privateuseone() && !(values.is_cpu() && values.dim() == 0)) return false;
  AdvIndex a;
  if (!adv_index(self, list, &a)) return false;
  for (const at::Tensor& i : a.indices)
    if (!separate(self, i)) return false;
  at::Tensor v;
  try {
    v = values.expand(a.shape);
  } catch (const std::exception&) {
    return false;
  }
  nk_tensor ts, tv;
  std::vector<nk_tensor> descs;
  std::vector<const nk_tensor*> ptrs;
  if (!to_nk(a.self, &ts) || !to_nk(v, &tv) || !index_descs(a, &descs, &ptrs)) return false;
  int64_t bad = INT64_MIN;
  int32_t bad_dim = -1;
  return nk_index_put(&ts, &tv, a.first, static_cast<int32_t>(ptrs.size()), ptrs.data(), accumulate, &bad,
                      &bad_dim) == NK_SUCCESS;
}

at::Tensor& neuron_index_put_impl_(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                                   const at::Tensor& values, bool accumulate, bool unsafe) {
  NEURON_NATIVE("aten::_index_put_impl_");
  if (!index_put_native(self, indices, values, accumulate)) {
    c10::List<std::optional<at::Tensor>> l(host_list(indices));
    at::Tensor s = host(self);
    at::_index_put_impl_(s, l, host(values), accumulate, unsafe);
  }
  return self;
}

}  // namespace
}  // namespace torch_neuronx

using namespace torch_neuronx;

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("arange.start_out", neuron_arange_out);
  m.impl("sort.values_stable", neuron_sort_out);
  m.impl("topk.values", neuron_topk_out);
  m.impl("isin.Tensor_Tensor_out", neuron_isin_out);
  m.impl("median.dim_values", neuron_median_dim_out);
  m.impl("nanmedian.dim_values", neuron_nanmedian_dim_out);
  m.impl("nonzero", neuron_nonzero);
  m.impl("nonzero.out", neuron_nonzero_out);
  m.impl("tril.out", neuron_tril_out);
  m.impl("triu.out", neuron_triu_out);
  m.impl("index.Tensor_out", neuron_index_out);
  m.impl("_index_put_impl_", neuron_index_put_impl_);
}
