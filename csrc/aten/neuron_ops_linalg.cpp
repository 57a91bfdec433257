// Native matrix products for the neuron device: mm, addmm, bmm, baddbmm, addmv, mv, dot (functional,
// out= and in-place forms), all on nk_gemm. linear and matmul decompose into these. Anything the
// kernel does not take (dtype, overlapping output, invalid shapes) runs PyTorch's CPU kernel on the
// same memory, so results and error messages are PyTorch's.
#include "aten/neuron_aten.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <initializer_list>

namespace torch_neuronx {
namespace {

bool gemm_dtype(at::ScalarType s) {
  return s == at::kFloat || s == at::kBFloat16 || s == at::kHalf || s == at::kDouble;
}

// PyTorch raises this for CUDA; CPU tensors passed with neuron ones would otherwise be read silently.
void check_devices(const char* op, std::initializer_list<const at::Tensor*> ts) {
  const at::Tensor* first = nullptr;
  for (const at::Tensor* t : ts) {
    if (!t->defined()) continue;
    if (first == nullptr) {
      first = t;
      continue;
    }
    TORCH_CHECK(t->device() == first->device(), "Expected all tensors to be on the same device, but found at least two "
                "devices, ", first->device(), " and ", t->device(), "! (when checking argument for ", op, ")");
  }
}

// fp32 and fp64 products of at most 64^3 multiply-adds (batch included) run PyTorch's CPU GEMM on the
// same memory. At that size the call and the packing cost as much as the arithmetic, so MKL is as fast,
// and CPU's summation differs between CPUs: on AMD EPYC (Zen 3) its products round every term before
// adding (a 5x5 product equals a plain sequential sum bit for bit), on a Xeon it fuses them as the
// native kernel does. Backward passes of QR- and SVD-based ops (householder_product, ormqr, pinv)
// amplify that last-bit difference past the gradient tolerance on rank-deficient inputs (pinv of a
// rank-1 50x50 matrix), so small products take CPU's own bits on every CPU; bf16 keeps its 16^3 rule
// inside the kernel (gemm.c), which reproduces CPU's plain loops for those sizes.
// The limit is a switch (`torch_neuronx._C._cpu_bits_macs`) so that tests can hold the kernel itself to
// small odd shapes.
std::atomic<int64_t> g_cpu_bits_macs{262144};

bool cpu_bits_product(const at::Tensor& out, const at::Tensor& a) {
  const at::ScalarType st = out.scalar_type();
  if (st != at::kFloat && st != at::kDouble) return false;
  const double k = a.dim() > 0 ? static_cast<double>(a.size(-1)) : 1.0;
  return static_cast<double>(out.numel()) * k <= static_cast<double>(g_cpu_bits_macs.load(std::memory_order_relaxed));
}

// A neuron copy of a CPU result (the CPU path of a functional op).
at::Tensor to_neuron(const at::Tensor& cpu, c10::Device device) {
  at::Tensor out = at::empty_strided(cpu.sizes(), cpu.strides(), cpu.options().device(device));
  cpu_alias(out).copy_(cpu);
  return out;
}

// The descriptor of t with a size-1 dim inserted at `dim` (a vector as an [M, 1] or [1, K] matrix).
void nk_unsqueeze(nk_tensor* t, int dim) {
  for (int d = t->ndim; d > dim; --d) {
    t->sizes[d] = t->sizes[d - 1];
    t->strides[d] = t->strides[d - 1];
  }
  t->sizes[dim] = 1;
  t->strides[dim] = 1;
  t->ndim += 1;
}

enum class Vec { None, AsColumn, AsRow, AsScalar };  // how a vector / 0-dim tensor becomes a matrix

struct Operand {
  const at::Tensor* t;
  Vec vec;
};

// out = beta * self + alpha * (a @ b) on the kernel, or false when it must run on the CPU instead:
// a dtype without a kernel, an output overlapping an input, a layout the descriptor cannot express.
// self == nullptr or self aliasing out as the same tensor accumulates into out.
bool gemm_native(const char* op, Operand out, Operand a, Operand b, Operand self, double alpha, double beta) {
  const at::ScalarType st = out.t->scalar_type();
  if (!gemm_dtype(st) || a.t->scalar_type() != st || b.t->scalar_type() != st) return false;
  if (cpu_bits_product(*out.t, *a.t)) return false;
  if (self.t != nullptr && self.t->scalar_type() != st) return false;
  if (!out.t->is_privateuseone()) return false;
  if (at::has_internal_overlap(*out.t) == at::MemOverlap::Yes) return false;
  if (may_overlap(*out.t, *a.t) || may_overlap(*out.t, *b.t)) return false;
  const bool in_place = self.t == nullptr || self.t->is_same(*out.t);
  if (!in_place && may_overlap(*out.t, *self.t)) return false;
  nk_tensor o, ta, tb, ts;
  if (!to_nk(*out.t, &o) || !to_nk(*a.t, &ta) || !to_nk(*b.t, &tb)) return false;
  if (!in_place && !to_nk(*self.t, &ts)) return false;
  auto shape = [](nk_tensor* t, Vec v) {
    if (v == Vec::AsColumn) nk_unsqueeze(t, t->ndim);
    if (v == Vec::AsRow) nk_unsqueeze(t, 0);
    if (v == Vec::AsScalar) {
      nk_unsqueeze(t, 0);
      nk_unsqueeze(t, 0);
    }
  };
  shape(&o, out.vec);
  shape(&ta, a.vec);
  shape(&tb, b.vec);
  if (!in_place) shape(&ts, self.vec);
  nk_status s = nk_gemm(&o, &ta, &tb, in_place ? nullptr : &ts, alpha, beta);
  if (s == NK_SUCCESS) return true;
  if (s == NK_UNSUPPORTED) return false;
  raise_kernel_status(s, op, *out.t);
}

Operand mat(const at::Tensor& t) { return {&t, Vec::None}; }

// ---- shape rules (anything else goes to the CPU kernel, which raises PyTorch's error) -------------------

bool mm_ok(const at::Tensor& a, const at::Tensor& b) {
  return a.dim() == 2 && b.dim() == 2 && a.scalar_type() == b.scalar_type() && a.size(1) == b.size(0);
}

bool bmm_ok(const at::Tensor& a, const at::Tensor& b) {
  return a.dim() == 3 && b.dim() == 3 && a.scalar_type() == b.scalar_type() && a.size(0) == b.size(0) &&
         a.size(2) == b.size(1);
}

bool mv_ok(const at::Tensor& m, const at::Tensor& v) {
  return m.dim() == 2 && v.dim() == 1 && m.scalar_type() == v.scalar_type() && m.size(1) == v.size(0);
}

bool self_ok(const at::Tensor& self, const at::Tensor& a, at::IntArrayRef shape) {
  return self.scalar_type() == a.scalar_type() && at::is_expandable_to(self.sizes(), shape);
}

// ---- mm -------------------------------------------------------------------------------------------------------

at::Tensor& mm_out_impl(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  check_devices("mm", {&a, &b, &out});
  if (mm_ok(a, b) && out.scalar_type() == a.scalar_type()) {
    at::native::resize_output(out, {a.size(0), b.size(1)});
    if (gemm_native("mm", mat(out), mat(a), mat(b), {nullptr, Vec::None}, 1.0, 0.0)) return out;
  }
  at::Tensor co = cpu_alias(out);
  at::mm_out(co, cpu_alias(a), cpu_alias(b));
  return out;
}

at::Tensor& neuron_mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  NEURON_NATIVE("aten::mm.out");
  return mm_out_impl(a, b, out);
}

at::Tensor neuron_mm(const at::Tensor& a, const at::Tensor& b) {
  NEURON_NATIVE("aten::mm");
  check_devices("mm", {&a, &b});
  if (!mm_ok(a, b)) return to_neuron(at::mm(cpu_alias(a), cpu_alias(b)), a.device());
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  return mm_out_impl(a, b, out);
}

// ---- addmm ----------------------------------------------------------------------------------------------------

at::Tensor& addmm_out_impl(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                           const at::Scalar& alpha, at::Tensor& out, bool in_place) {
  check_devices("addmm", {&self, &a, &b, &out});
  if (mm_ok(a, b) && out.scalar_type() == a.scalar_type() && !beta.isComplex() && !alpha.isComplex()) {
    std::vector<int64_t> shape{a.size(0), b.size(1)};
    bool ok = in_place ? self.sizes() == at::IntArrayRef(shape) : self_ok(self, a, shape);
    if (ok) {
      if (!in_place) at::native::resize_output(out, shape);
      at::Tensor s = in_place || self.is_same(out) ? out : self.expand(shape);
      if (gemm_native("addmm", mat(out), mat(a), mat(b), mat(s), alpha.toDouble(), beta.toDouble())) return out;
    }
  }
  at::Tensor co = cpu_alias(out);
  if (in_place) co.addmm_(cpu_alias(a), cpu_alias(b), beta, alpha);
  else at::addmm_out(co, cpu_alias(self), cpu_alias(a), cpu_alias(b), beta, alpha);
  return out;
}

at::Tensor& neuron_addmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                             const at::Scalar& alpha, at::Tensor& out) {
  NEURON_NATIVE("aten::addmm.out");
  return addmm_out_impl(self, a, b, beta, alpha, out, false);
}

at::Tensor& neuron_addmm_(at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                          const at::Scalar& alpha) {
  NEURON_NATIVE("aten::addmm_");
  return addmm_out_impl(self, a, b, beta, alpha, self, true);
}

at::Tensor neuron_addmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                        const at::Scalar& alpha) {
  NEURON_NATIVE("aten::addmm");
  check_devices("addmm", {&self, &a, &b});
  if (!mm_ok(a, b) || !self_ok(self, a, {a.size(0), b.size(1)}))
    return to_neuron(at::addmm(cpu_alias(self), cpu_alias(a), cpu_alias(b), beta, alpha), a.device());
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  return addmm_out_impl(self, a, b, beta, alpha, out, false);
}

// ---- bmm / baddbmm ------------------------------------------------------------------------------------------

at::Tensor& bmm_out_impl(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  check_devices("bmm", {&a, &b, &out});
  if (bmm_ok(a, b) && out.scalar_type() == a.scalar_type()) {
    at::native::resize_output(out, {a.size(0), a.size(1), b.size(2)});
    if (gemm_native("bmm", mat(out), mat(a), mat(b), {nullptr, Vec::None}, 1.0, 0.0)) return out;
  }
  at::Tensor co = cpu_alias(out);
  at::bmm_out(co, cpu_alias(a), cpu_alias(b));
  return out;
}

at::Tensor& neuron_bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  NEURON_NATIVE("aten::bmm.out");
  return bmm_out_impl(a, b, out);
}

at::Tensor neuron_bmm(const at::Tensor& a, const at::Tensor& b) {
  NEURON_NATIVE("aten::bmm");
  check_devices("bmm", {&a, &b});
  if (!bmm_ok(a, b)) return to_neuron(at::bmm(cpu_alias(a), cpu_alias(b)), a.device());
  at::Tensor out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  return bmm_out_impl(a, b, out);
}

at::Tensor& baddbmm_out_impl(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                             const at::Scalar& alpha, at::Tensor& out, bool in_place) {
  check_devices("baddbmm", {&self, &a, &b, &out});
  if (bmm_ok(a, b) && out.scalar_type() == a.scalar_type() && !beta.isComplex() && !alpha.isComplex()) {
    std::vector<int64_t> shape{a.size(0), a.size(1), b.size(2)};
    bool ok = in_place ? self.sizes() == at::IntArrayRef(shape) : self_ok(self, a, shape);
    if (ok) {
      if (!in_place) at::native::resize_output(out, shape);
      at::Tensor s = in_place || self.is_same(out) ? out : self.expand(shape);
      if (gemm_native("baddbmm", mat(out), mat(a), mat(b), mat(s), alpha.toDouble(), beta.toDouble())) return out;
    }
  }
  at::Tensor co = cpu_alias(out);
  if (in_place) co.baddbmm_(cpu_alias(a), cpu_alias(b), beta, alpha);
  else at::baddbmm_out(co, cpu_alias(self), cpu_alias(a), cpu_alias(b), beta, alpha);
  return out;
}

at::Tensor& neuron_baddbmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                               const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  NEURON_NATIVE("aten::baddbmm.out");
  return baddbmm_out_impl(self, a, b, beta, alpha, out, false);
}

at::Tensor& neuron_baddbmm_(at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                            const at::Scalar& alpha) {
  NEURON_NATIVE("aten::baddbmm_");
  return baddbmm_out_impl(self, a, b, beta, alpha, self, true);
}

at::Tensor neuron_baddbmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                          const at::Scalar& alpha) {
  NEURON_NATIVE("aten::baddbmm");
  check_devices("baddbmm", {&self, &a, &b});
  if (!bmm_ok(a, b) || !self_ok(self, a, {a.size(0), a.size(1), b.size(2)}))
    return to_neuron(at::baddbmm(cpu_alias(self), cpu_alias(a), cpu_alias(b), beta, alpha), a.device());
  at::Tensor out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  return baddbmm_out_impl(self, a, b, beta, alpha, out, false);
}

// ---- addmv / mv ---------------------------------------------------------------------------------------------

at::Tensor& addmv_out_impl(const at::Tensor& self, const at::Tensor& m, const at::Tensor& v, const at::Scalar& beta,
                           const at::Scalar& alpha, at::Tensor& out, bool in_place) {
  check_devices("addmv", {&self, &m, &v, &out});
  if (mv_ok(m, v) && out.scalar_type() == m.scalar_type() && !beta.isComplex() && !alpha.isComplex()) {
    std::vector<int64_t> shape{m.size(0)};
    bool ok = in_place ? self.sizes() == at::IntArrayRef(shape) : self_ok(self, m, shape);
    if (ok) {
      if (!in_place) at::native::resize_output(out, shape);
      at::Tensor s = in_place || self.is_same(out) ? out : self.expand(shape);
      if (gemm_native("addmv", {&out, Vec::AsColumn}, mat(m), {&v, Vec::AsColumn}, {&s, Vec::AsColumn},
                      alpha.toDouble(), beta.toDouble()))
        return out;
    }
  }
  at::Tensor co = cpu_alias(out);
  if (in_place) co.addmv_(cpu_alias(m), cpu_alias(v), beta, alpha);
  else at::addmv_out(co, cpu_alias(self), cpu_alias(m), cpu_alias(v), beta, alpha);
  return out;
}

at::Tensor& neuron_addmv_out(const at::Tensor& self, const at::Tensor& m, const at::Tensor& v, const at::Scalar& beta,
                             const at::Scalar& alpha, at::Tensor& out) {
  NEURON_NATIVE("aten::addmv.out");
  return addmv_out_impl(self, m, v, beta, alpha, out, false);
}

at::Tensor& neuron_addmv_(at::Tensor& self, const at::Tensor& m, const at::Tensor& v, const at::Scalar& beta,
                          const at::Scalar& alpha) {
  NEURON_NATIVE("aten::addmv_");
  return addmv_out_impl(self, m, v, beta, alpha, self, true);
}

at::Tensor neuron_addmv(const at::Tensor& self, const at::Tensor& m, const at::Tensor& v, const at::Scalar& beta,
                        const at::Scalar& alpha) {
  NEURON_NATIVE("aten::addmv");
  check_devices("addmv", {&self, &m, &v});
  if (!mv_ok(m, v) || !self_ok(self, m, {m.size(0)}))
    return to_neuron(at::addmv(cpu_alias(self), cpu_alias(m), cpu_alias(v), beta, alpha), m.device());
  at::Tensor out = at::empty({m.size(0)}, m.options());
  return addmv_out_impl(self, m, v, beta, alpha, out, false);
}

at::Tensor neuron_mv(const at::Tensor& m, const at::Tensor& v) {
  NEURON_NATIVE("aten::mv");
  check_devices("mv", {&m, &v});
  if (!mv_ok(m, v)) return to_neuron(at::mv(cpu_alias(m), cpu_alias(v)), m.device());
  at::Tensor out = at::empty({m.size(0)}, m.options());
  if (gemm_native("mv", {&out, Vec::AsColumn}, mat(m), {&v, Vec::AsColumn}, {nullptr, Vec::None}, 1.0, 0.0))
    return out;
  at::Tensor co = cpu_alias(out);
  at::mv_out(co, cpu_alias(m), cpu_alias(v));
  return out;
}

// ---- dot --------------------------------------------------------------------------------------------------------

at::Tensor neuron_dot(const at::Tensor& a, const at::Tensor& b) {
  NEURON_NATIVE("aten::dot");
  check_devices("dot", {&a, &b});
  if (a.dim() == 1 && b.dim() == 1 && a.numel() == b.numel() && a.scalar_type() == b.scalar_type()) {
    at::Tensor out = at::empty({}, a.options());
    // The 0-dim result as a [1, 1] matrix: a [1, K] row times a [K, 1] column.
    if (gemm_native("dot", {&out, Vec::AsScalar}, {&a, Vec::AsRow}, {&b, Vec::AsColumn}, {nullptr, Vec::None}, 1.0, 0.0))
      return out;
  }
  return to_neuron(at::dot(cpu_alias(a), cpu_alias(b)), a.device());
}

}  // namespace

int64_t exchange_cpu_bits_macs(int64_t macs) { return g_cpu_bits_macs.exchange(macs); }

}  // namespace torch_neuronx

using namespace torch_neuronx;

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mm", neuron_mm);
  m.impl("mm.out", neuron_mm_out);
  m.impl("addmm", neuron_addmm);
  m.impl("addmm.out", neuron_addmm_out);
  m.impl("addmm_", neuron_addmm_);
  m.impl("bmm", neuron_bmm);
  m.impl("bmm.out", neuron_bmm_out);
  m.impl("baddbmm", neuron_baddbmm);
  m.impl("baddbmm.out", neuron_baddbmm_out);
  m.impl("baddbmm_", neuron_baddbmm_);
  m.impl("addmv", neuron_addmv);
  m.impl("addmv.out", neuron_addmv_out);
  m.impl("addmv_", neuron_addmv_);
  m.impl("mv", neuron_mv);
  m.impl("dot", neuron_dot);
}
