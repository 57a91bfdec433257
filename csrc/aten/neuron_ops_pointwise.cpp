// Element-wise operators on neuron: arithmetic, comparisons, logical/bitwise, where, masked_fill, clamp,
// pow, transcendentals, activations and their backward ops.
//
// Structured ops reach us through their .out overload. We run PyTorch's own meta function (a subclass of
// the at::meta::structured_* iterator), so shape checks, type promotion, errors and output resizing are
// exactly PyTorch's, then hand the built TensorIterator's operands to one C entry point per op family
// (nk_unary / nk_binary / nk_ternary). Anything the kernels do not cover (complex, unsigned 16-64 bit,
// >16 dims, conj/neg views) runs the CPU kernel on aliased memory, so results always equal CPU.
#include "aten/neuron_aten.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ScalarOps.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/add_meta.h>
#include <ATen/ops/bitwise_and_meta.h>
#include <ATen/ops/bitwise_not_meta.h>
#include <ATen/ops/bitwise_or_meta.h>
#include <ATen/ops/bitwise_xor_meta.h>
#include <ATen/ops/clamp_max_meta.h>
#include <ATen/ops/clamp_meta.h>
#include <ATen/ops/clamp_min_meta.h>
#include <ATen/ops/cos_meta.h>
#include <ATen/ops/div_meta.h>
#include <ATen/ops/eq_meta.h>
#include <ATen/ops/exp_meta.h>
#include <ATen/ops/ge_meta.h>
#include <ATen/ops/gelu_backward_meta.h>
#include <ATen/ops/gelu_meta.h>
#include <ATen/ops/gt_meta.h>
#include <ATen/ops/le_meta.h>
#include <ATen/ops/log_meta.h>
#include <ATen/ops/lt_meta.h>
#include <ATen/ops/mul_meta.h>
#include <ATen/ops/ne_meta.h>
#include <ATen/ops/neg_meta.h>
#include <ATen/ops/pow_meta.h>
#include <ATen/ops/reciprocal_meta.h>
#include <ATen/ops/rsqrt_meta.h>
#include <ATen/ops/sigmoid_backward_meta.h>
#include <ATen/ops/sigmoid_meta.h>
#include <ATen/ops/silu_backward_meta.h>
#include <ATen/ops/silu_meta.h>
#include <ATen/ops/sin_meta.h>
#include <ATen/ops/sqrt_meta.h>
#include <ATen/ops/sub_meta.h>
#include <ATen/ops/tanh_backward_meta.h>
#include <ATen/ops/tanh_meta.h>
#include <ATen/ops/threshold_backward_meta.h>
#include <torch/library.h>

#include <optional>
#include <type_traits>

namespace torch_neuronx {
namespace {

// ---- structured out= plumbing -------------------------------------------------------------------

// What the generated out= wrappers do: resize the given output (or use a proxy with the strides the
// meta function asks for), then let the iterator record it.
// An undefined output (the functional overloads, see Functional) is allocated as the meta function
// asks, like the generated functional wrappers do.
// An op's new output, allocated the way CPU's structured kernels allocate theirs (at::detail::empty_*),
// not through at::empty: its trip through the dispatcher cost more than the allocation itself (~1000 of
// the ~6800 instructions of a 1-element add).
at::Tensor empty_output(at::IntArrayRef sizes, at::IntArrayRef strides, const at::TensorOptions& options) {
  const c10::Device d = options.device();
  if (d.type() != c10::DeviceType::PrivateUse1 || options.layout() != at::kStrided)
    return strides.empty() ? at::empty(sizes, options) : at::empty_strided(sizes, strides, options);
  std::optional<c10::DeviceGuard> guard;
  if (d.has_index() && d.index() != current_device()) guard.emplace(d);
  const c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  const at::ScalarType dt = options.dtype().toScalarType();
  return strides.empty() ? at::detail::empty_generic(sizes, neuron_allocator(), ks, dt, options.memory_format_opt())
                         : at::detail::empty_strided_generic(sizes, strides, neuron_allocator(), ks, dt);
}

template <class Meta>
struct OutOp final : Meta {
  explicit OutOp(at::Tensor& out) : out_(out) {}

  void set_output_strided(int64_t idx, at::IntArrayRef sizes, at::IntArrayRef strides, at::TensorOptions options) override {
    set_output(idx, sizes, strides, options, /*raw=*/false);
  }
  void set_output_raw_strided(int64_t idx, at::IntArrayRef sizes, at::IntArrayRef strides,
                              at::TensorOptions options) override {
    set_output(idx, sizes, strides, options, /*raw=*/true);
  }
  const at::Tensor& maybe_get_output(int64_t) override { return proxy_ ? *proxy_ : out_; }

  // Copies a proxy result back into the caller's output.
  void finish() {
    if (proxy_) out_.copy_(*proxy_);
  }

 private:
  void set_output(int64_t idx, at::IntArrayRef sizes, at::IntArrayRef strides, at::TensorOptions options, bool raw) {
    if (!out_.defined()) {
      out_ = empty_output(sizes, strides, options);
      if constexpr (std::is_base_of_v<at::TensorIteratorBase, Meta>) {
        Meta::set_output_raw_strided(idx, sizes, strides, options);
      }
      return;
    }
    TORCH_CHECK(options.dtype() == out_.dtype(), "Expected out tensor to have dtype ", options.dtype(), ", but got ",
                out_.dtype(), " instead");
    TORCH_CHECK(options.device() == out_.device(), "Expected out tensor to have device ", options.device(),
                ", but got ", out_.device(), " instead");
    const bool resized = at::native::resize_output(out_, sizes);
    if (resized && !strides.empty()) {
      out_.as_strided_(sizes, strides);
    } else if (resized && options.memory_format_opt().has_value()) {
      out_.unsafeGetTensorImpl()->empty_tensor_restride(*options.memory_format_opt());
    }
    if (!raw && !strides.empty() && out_.strides() != strides) {
      proxy_ = empty_output(sizes, strides, options);
    }
    if constexpr (std::is_base_of_v<at::TensorIteratorBase, Meta>) {
      Meta::set_output_raw_strided(idx, sizes, strides, options);
    }
  }

  at::Tensor& out_;
  std::optional<at::Tensor> proxy_;
};

// The functional overload of an OutOp kernel (an undefined output, allocated by the meta function):
// without it PyTorch's structured wrapper runs the meta function, allocates, and dispatches again to
// the out= kernel, which runs the meta function a second time (about 0.4 us of a 1.9 us small op).
template <class... T>
struct TypeList {};
template <class Done, class Rest>
struct DropLast;
template <class... D, class Last>
struct DropLast<TypeList<D...>, TypeList<Last>> {
  using type = TypeList<D...>;
};
template <class... D, class A, class B, class... R>
struct DropLast<TypeList<D...>, TypeList<A, B, R...>> : DropLast<TypeList<D..., A>, TypeList<B, R...>> {};
template <auto OutFn, class Args>
struct FunctionalOf;
template <auto OutFn, class... A>
struct FunctionalOf<OutFn, TypeList<A...>> {
  static at::Tensor call(A... a) {
    at::Tensor out;
    OutFn(a..., out);
    return out;
  }
};
template <class Sig>
struct OutArgs;
template <class... A>
struct OutArgs<at::Tensor& (*)(A...)> {
  using type = typename DropLast<TypeList<>, TypeList<A...>>::type;
};
template <auto OutFn>
constexpr auto Functional = &FunctionalOf<OutFn, typename OutArgs<decltype(OutFn)>::type>::call;

// The in-place overload the same way: the out= kernel with self as the output.
template <auto OutFn, class Args>
struct InplaceOf;
template <auto OutFn, class First, class... A>
struct InplaceOf<OutFn, TypeList<First, A...>> {
  static at::Tensor& call(at::Tensor& self, A... a) { return OutFn(self, a..., self); }
};
template <auto OutFn>
constexpr auto Inplace = &InplaceOf<OutFn, typename OutArgs<decltype(OutFn)>::type>::call;

// ---- kernel calls -------------------------------------------------------------------------------

at::Tensor cpu(const at::Tensor& t) { return !t.defined() || t.is_cpu() ? t : cpu_alias(t); }
// The CPU alias of an output, as the lvalue the at::*_out functions take (it lives until the end of
// the full expression, i.e. the call).
at::Tensor& cpu_out(const at::Tensor& t, at::Tensor&& tmp = at::Tensor()) { return tmp = cpu(t); }

enum class Family { Unary, Binary, Ternary };

// The operands of a built iterator as a kernel descriptor; operand `skip` is left out (a scalar the
// caller passes in the params instead).
bool describe(const at::TensorIteratorBase& it, at::ScalarType common, nk_ew_iter* e, int skip = -1) {
  if (it.ndim() > NK_MAX_DIMS || it.ntensors() > NK_EW_MAX_OPS) return false;
  if (!nk_dtype_of(common, &e->common)) return false;
  e->ndim = static_cast<int32_t>(it.ndim());
  for (int d = 0; d < it.ndim(); d++) e->sizes[d] = it.shape()[d];
  int n = 0;
  for (int k = 0; k < it.ntensors(); k++) {
    if (k == skip) continue;
    const at::TensorBase& t = it.tensor_base(k);
    if (t.is_neg() || t.is_conj()) return false;
    if (!nk_dtype_of(it.dtype(k), &e->dtype[n])) return false;
    e->data[n] = it.data_ptr(k);
    at::IntArrayRef st = it.strides(k);
    for (int d = 0; d < it.ndim(); d++) e->strides[n][d] = st[d];
    n++;
  }
  e->nops = n;
  return true;
}

// Runs the kernel; false when it does not handle these dtypes (the caller then runs the CPU kernel).
bool run(Family fam, int op, const at::TensorIteratorBase& it, at::ScalarType common, const nk_ew_params& p,
         const char* name, int skip = -1) {
  if (it.numel() == 0) return true;
  nk_ew_iter e{};
  if (!describe(it, common, &e, skip)) return false;
  nk_status st = fam == Family::Unary    ? nk_unary(static_cast<nk_unary_op>(op), &e, &p)
                 : fam == Family::Binary ? nk_binary(static_cast<nk_binary_op>(op), &e, &p)
                                         : nk_ternary(static_cast<nk_ternary_op>(op), &e, &p);
  if (st == NK_SUCCESS) return true;
  if (st == NK_UNSUPPORTED) return false;
  TORCH_CHECK(st != NK_DIV_BY_ZERO, "ZeroDivisionError");
  TORCH_CHECK(false, name, ": neuron kernel failed (status ", static_cast<int>(st), ") for shape ", it.shape(),
              " and common dtype ", common);
}

// A Scalar converted to `st` as PyTorch's kernels do (Scalar::to<scalar_t>, which raises on overflow).
std::optional<nk_scalar> scalar_as(const at::Scalar& s, at::ScalarType st) {
  if (s.isComplex()) return std::nullopt;
  nk_scalar r{};
  switch (st) {
    case at::kBool: r.i = s.to<bool>(); break;
    case at::kByte: r.i = s.to<uint8_t>(); break;
    case at::kChar: r.i = s.to<int8_t>(); break;
    case at::kShort: r.i = s.to<int16_t>(); break;
    case at::kInt: r.i = s.to<int32_t>(); break;
    case at::kLong: r.i = s.to<int64_t>(); break;
    case at::kHalf: r.is_float = true; r.f = static_cast<float>(s.to<at::Half>()); break;
    case at::kBFloat16: r.is_float = true; r.f = static_cast<float>(s.to<at::BFloat16>()); break;
    case at::kFloat: r.is_float = true; r.f = s.to<float>(); break;
    case at::kDouble: r.is_float = true; r.f = s.to<double>(); break;
    default: return std::nullopt;
  }
  return r;
}

nk_scalar float_scalar(double v) {
  nk_scalar r{};
  r.is_float = true;
  r.f = v;
  return r;
}

bool is_reduced(at::ScalarType st) { return st == at::kHalf || st == at::kBFloat16; }

// ---- structured unary ops -----------------------------------------------------------------------

#define NEURON_UNARY_OUT(name, NKOP)                                                      \
  at::Tensor& neuron_##name##_out(const at::Tensor& self, at::Tensor& out) {                \
    NEURON_NATIVE("aten::" #name ".out");                                                   \
    OutOp<at::meta::structured_##name> op(out);                                             \
    op.meta(self);                                                                          \
    const at::Tensor& r = op.maybe_get_output(0);                                           \
    if (!run(Family::Unary, NKOP, op, op.common_dtype(), nk_ew_params{}, #name))            \
      at::name##_out(cpu_out(r), cpu(self));                                                    \
    op.finish();                                                                            \
    return out;                                                                             \
  }

NEURON_UNARY_OUT(neg, NK_NEG)
NEURON_UNARY_OUT(exp, NK_EXP)
NEURON_UNARY_OUT(log, NK_LOG)
NEURON_UNARY_OUT(sqrt, NK_SQRT)

// PyTorch's CPU rounds a half/bfloat16 x ** -0.5 one way in its vector loop (1/sqrt in float, rounded
// once) and another in its scalar loop (the square root rounded, then its reciprocal): which elements take
// which depends on the layout and on the CPU's vector width, so only its own kernel matches it in every
// layout (a normalize p=0.5 gradient differed by 2 bfloat16 ulps). rsqrt and pow(-0.5) of those types run it.
at::Tensor& neuron_rsqrt_out(const at::Tensor& self, at::Tensor& out) {
  NEURON_NATIVE("aten::rsqrt.out");
  OutOp<at::meta::structured_rsqrt> op(out);
  op.meta(self);
  const at::Tensor& r = op.maybe_get_output(0);
  const at::ScalarType common = op.common_dtype();
  if (is_reduced(common) || !run(Family::Unary, NK_RSQRT, op, common, nk_ew_params{}, "rsqrt"))
    at::rsqrt_out(cpu_out(r), cpu(self));
  op.finish();
  return out;
}
NEURON_UNARY_OUT(reciprocal, NK_RECIPROCAL)
NEURON_UNARY_OUT(sin, NK_SIN)
NEURON_UNARY_OUT(cos, NK_COS)
NEURON_UNARY_OUT(tanh, NK_TANH)
NEURON_UNARY_OUT(sigmoid, NK_SIGMOID)
NEURON_UNARY_OUT(silu, NK_SILU)

at::Tensor& neuron_bitwise_not_out(const at::Tensor& self, at::Tensor& out) {
  NEURON_NATIVE("aten::bitwise_not.out");
  OutOp<at::meta::structured_bitwise_not> op(out);
  op.meta(self);
  const at::Tensor& r = op.maybe_get_output(0);
  // On bool, bitwise not is logical not.
  int nkop = op.common_dtype() == at::kBool ? NK_LOGICAL_NOT : NK_BITWISE_NOT;
  if (!run(Family::Unary, nkop, op, op.common_dtype(), nk_ew_params{}, "bitwise_not"))
    at::bitwise_not_out(cpu_out(r), cpu(self));
  op.finish();
  return out;
}

// PyTorch's CPU kernel validates the string when it runs (get_gelutype_enum), not in the meta function.
void check_gelu_approximate(c10::string_view approximate) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "approximate argument must be either none or tanh.");
}

at::Tensor& neuron_gelu_out(const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  NEURON_NATIVE("aten::gelu.out");
  check_gelu_approximate(approximate);
  OutOp<at::meta::structured_gelu> op(out);
  op.meta(self, approximate);
  const at::Tensor& r = op.maybe_get_output(0);
  int nkop = approximate == "tanh" ? NK_GELU_TANH : NK_GELU;
  if (!run(Family::Unary, nkop, op, op.common_dtype(), nk_ew_params{}, "gelu"))
    at::gelu_out(cpu_out(r), cpu(self), approximate);
  op.finish();
  return out;
}

// abs is not structured: CPU builds TensorIterator::unary_op (same dtype in and out).
at::Tensor& neuron_abs_out(const at::Tensor& self, at::Tensor& out) {
  NEURON_NATIVE("aten::abs.out");
  if (!self.is_complex()) {
    auto it = at::TensorIterator::unary_op(out, self);
    if (run(Family::Unary, NK_ABS, it, self.scalar_type(), nk_ew_params{}, "abs")) return out;
  }
  at::abs_out(cpu_out(out), cpu(self));
  return out;
}

at::Tensor& neuron_logical_not_out(const at::Tensor& self, at::Tensor& out) {
  NEURON_NATIVE("aten::logical_not.out");
  auto it = at::TensorIteratorConfig().check_all_same_dtype(false).add_output(out).add_const_input(self).build();
  if (!run(Family::Unary, NK_LOGICAL_NOT, it, self.scalar_type(), nk_ew_params{}, "logical_not"))
    at::logical_not_out(cpu_out(out), cpu(self));
  return out;
}

at::Tensor neuron_relu(const at::Tensor& self) {
  NEURON_NATIVE("aten::relu");
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  return at::clamp_min(self, 0);
}

at::Tensor& neuron_relu_(at::Tensor& self) {
  NEURON_NATIVE("aten::relu_");
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  return at::clamp_min_(self, 0);
}

// ---- structured binary ops ----------------------------------------------------------------------

// add/sub: a + alpha * b with alpha converted to the common dtype. PyTorch's CPU computes a half/bfloat16
// a + alpha * b in float and rounds once in its vector loop, but rounds alpha * b to the dtype first in its
// scalar loop (the last elements of each thread's chunk, or a small tensor whole), so with alpha != 1 an
// element's bits depend on where it falls (a tie rounded the other way: 1 in 10^4 elements, one fp16 ulp).
// Those run PyTorch's CPU kernel on the same memory, so every element is CPU's.
bool cpu_alpha(const at::Scalar& alpha, at::ScalarType common) {
  if (!is_reduced(common)) return false;
  return alpha.isIntegral(false) ? alpha.toLong() != 1 : !(alpha.isFloatingPoint() && alpha.toDouble() == 1.0);
}

template <class Meta>
at::Tensor& add_like(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha, at::Tensor& out,
                     bool negate, const char* name) {
  OutOp<Meta> op(out);
  op.meta(self, other, alpha);
  const at::Tensor& r = op.maybe_get_output(0);
  const at::ScalarType common = op.common_dtype();
  std::optional<nk_scalar> a;
  if (!cpu_alpha(alpha, common)) a = scalar_as(alpha, common);
  bool done = false;
  if (a) {
    nk_ew_params p{};
    p.alpha = *a;
    if (negate) {
      if (p.alpha.is_float) p.alpha.f = -p.alpha.f;
      else p.alpha.i = static_cast<int64_t>(0ull - static_cast<uint64_t>(p.alpha.i));
    }
    done = run(Family::Binary, NK_ADD, op, common, p, name);
  }
  if (!done) {
    if (negate) at::sub_out(cpu_out(r), cpu(self), cpu(other), alpha);
    else at::add_out(cpu_out(r), cpu(self), cpu(other), alpha);
  }
  op.finish();
  return out;
}

at::Tensor& neuron_add_out(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha, at::Tensor& out) {
  NEURON_NATIVE("aten::add.out");
  return add_like<at::meta::structured_add_Tensor>(self, other, alpha, out, false, "add");
}

at::Tensor& neuron_sub_out(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha, at::Tensor& out) {
  NEURON_NATIVE("aten::sub.out");
  return add_like<at::meta::structured_sub_Tensor>(self, other, alpha, out, true, "sub");
}

// mul/div with a one-element second operand in bfloat16/float16: PyTorch uses the operand's original
// value in float (not rounded to the common dtype), so we pass it as a scalar.
bool run_scalar_aware(int nkop, at::TensorIteratorBase& it, const char* name) {
  const at::ScalarType common = it.common_dtype();
  if (is_reduced(common) && it.is_scalar(2) && it.data_ptr(2) != nullptr && !it.tensor_base(2).is_neg()) {
    nk_ew_params p{};
    p.value = float_scalar(it.original_scalar_value<float>(2));
    return run(Family::Binary, nkop, it, common, p, name, /*skip=*/2);
  }
  return run(Family::Binary, nkop, it, common, nk_ew_params{}, name);
}

at::Tensor& neuron_mul_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  NEURON_NATIVE("aten::mul.out");
  OutOp<at::meta::structured_mul_Tensor> op(out);
  op.meta(self, other);
  const at::Tensor& r = op.maybe_get_output(0);
  if (!run_scalar_aware(NK_MUL, op, "mul")) at::mul_out(cpu_out(r), cpu(self), cpu(other));
  op.finish();
  return out;
}

at::Tensor& neuron_div_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  NEURON_NATIVE("aten::div.out");
  OutOp<at::meta::structured_div_Tensor> op(out);
  op.meta(self, other);
  const at::Tensor& r = op.maybe_get_output(0);
  if (!run_scalar_aware(NK_DIV, op, "div")) at::div_out(cpu_out(r), cpu(self), cpu(other));
  op.finish();
  return out;
}

at::Tensor& neuron_div_out_mode(const at::Tensor& self, const at::Tensor& other,
                                std::optional<c10::string_view> rounding_mode, at::Tensor& out) {
  NEURON_NATIVE("aten::div.out_mode");
  OutOp<at::meta::structured_div_Tensor_mode> op(out);
  op.meta(self, other, rounding_mode);
  const at::Tensor& r = op.maybe_get_output(0);
  bool done;
  if (!rounding_mode.has_value()) {
    done = run_scalar_aware(NK_DIV, op, "div");
  } else {
    int nkop = *rounding_mode == "trunc" ? NK_DIV_TRUNC : NK_DIV_FLOOR;
    done = run(Family::Binary, nkop, op, op.common_dtype(), nk_ew_params{}, "div");
  }
  if (!done) at::div_out(cpu_out(r), cpu(self), cpu(other), rounding_mode);
  op.finish();
  return out;
}

// Binary ops with no scalar argument: comparisons, bitwise, pow, backward ops.
#define NEURON_BINARY_OUT(fname, regname, META, nkop, cpucall)                              \
  at::Tensor& fname(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {     \
    NEURON_NATIVE("aten::" regname);                                                         \
    OutOp<at::meta::META> op(out);                                                           \
    op.meta(self, other);                                                                    \
    const at::Tensor& r = op.maybe_get_output(0);                                            \
    if (!run(Family::Binary, nkop, op, op.common_dtype(), nk_ew_params{}, regname))          \
      cpucall(cpu_out(r), cpu(self), cpu(other));                                                \
    op.finish();                                                                             \
    return out;                                                                              \
  }

#define NEURON_COMPARE_OUT(name, NKOP)                                                                           \
  NEURON_BINARY_OUT(neuron_##name##_tensor_out, #name ".Tensor_out", structured_##name##_Tensor, NKOP, at::name##_out) \
  at::Tensor& neuron_##name##_scalar_out(const at::Tensor& self, const at::Scalar& other, at::Tensor& out) {      \
    NEURON_NATIVE("aten::" #name ".Scalar_out");                                                                 \
    OutOp<at::meta::structured_##name##_Scalar> op(out);                                                         \
    op.meta(self, other);                                                                                        \
    const at::Tensor& r = op.maybe_get_output(0);                                                                \
    if (!run(Family::Binary, NKOP, op, op.common_dtype(), nk_ew_params{}, #name))                                 \
      at::name##_out(cpu_out(r), cpu(self), other);                                                                  \
    op.finish();                                                                                                 \
    return out;                                                                                                  \
  }

NEURON_COMPARE_OUT(eq, NK_EQ)
NEURON_COMPARE_OUT(ne, NK_NE)
NEURON_COMPARE_OUT(lt, NK_LT)
NEURON_COMPARE_OUT(le, NK_LE)
NEURON_COMPARE_OUT(gt, NK_GT)
NEURON_COMPARE_OUT(ge, NK_GE)

NEURON_BINARY_OUT(neuron_bitwise_and_out, "bitwise_and.Tensor_out", structured_bitwise_and_Tensor, NK_BITWISE_AND,
                  at::bitwise_and_out)
NEURON_BINARY_OUT(neuron_bitwise_or_out, "bitwise_or.Tensor_out", structured_bitwise_or_Tensor, NK_BITWISE_OR,
                  at::bitwise_or_out)
NEURON_BINARY_OUT(neuron_bitwise_xor_out, "bitwise_xor.Tensor_out", structured_bitwise_xor_Tensor, NK_BITWISE_XOR,
                  at::bitwise_xor_out)
NEURON_BINARY_OUT(neuron_clamp_min_tensor_out, "clamp_min.Tensor_out", structured_clamp_min_Tensor, NK_MAXIMUM,
                  at::clamp_min_out)
NEURON_BINARY_OUT(neuron_clamp_max_tensor_out, "clamp_max.Tensor_out", structured_clamp_max_Tensor, NK_MINIMUM,
                  at::clamp_max_out)
NEURON_BINARY_OUT(neuron_silu_backward_out, "silu_backward.grad_input", structured_silu_backward, NK_SILU_BACKWARD,
                  at::silu_backward_out)
NEURON_BINARY_OUT(neuron_sigmoid_backward_out, "sigmoid_backward.grad_input", structured_sigmoid_backward,
                  NK_SIGMOID_BACKWARD, at::sigmoid_backward_out)
NEURON_BINARY_OUT(neuron_tanh_backward_out, "tanh_backward.grad_input", structured_tanh_backward, NK_TANH_BACKWARD,
                  at::tanh_backward_out)


at::Tensor& neuron_pow_tensor_tensor_out(const at::Tensor& self, const at::Tensor& exponent, at::Tensor& out) {
  NEURON_NATIVE("aten::pow.Tensor_Tensor_out");
  OutOp<at::meta::structured_pow_Tensor_Tensor> op(out);
  op.meta(self, exponent);
  const at::Tensor& r = op.maybe_get_output(0);
  bool done = op.common_dtype() != at::kBool &&
              run(Family::Binary, NK_POW, op, op.common_dtype(), nk_ew_params{}, "pow");
  if (!done) at::pow_out(cpu_out(r), cpu(self), cpu(exponent));
  op.finish();
  return out;
}

at::Tensor& neuron_gelu_backward_out(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate,
                                     at::Tensor& grad_input) {
  NEURON_NATIVE("aten::gelu_backward.grad_input");
  check_gelu_approximate(approximate);
  OutOp<at::meta::structured_gelu_backward> op(grad_input);
  op.meta(grad, self, approximate);
  const at::Tensor& r = op.maybe_get_output(0);
  int nkop = approximate == "tanh" ? NK_GELU_TANH_BACKWARD : NK_GELU_BACKWARD;
  if (!run(Family::Binary, nkop, op, op.common_dtype(), nk_ew_params{}, "gelu_backward"))
    at::gelu_backward_out(cpu_out(r), cpu(grad), cpu(self), approximate);
  op.finish();
  return grad_input;
}

at::Tensor& neuron_threshold_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& threshold,
                                          at::Tensor& grad_input) {
  NEURON_NATIVE("aten::threshold_backward.grad_input");
  OutOp<at::meta::structured_threshold_backward> op(grad_input);
  op.meta(grad, self, threshold);
  const at::Tensor& r = op.maybe_get_output(0);
  std::optional<nk_scalar> t = scalar_as(threshold, op.common_dtype());
  nk_ew_params p{};
  if (t) p.value = *t;
  // The iterator's inputs are (self, grad): x <= threshold ? 0 : grad.
  if (!t || !run(Family::Binary, NK_THRESHOLD_BACKWARD, op, op.common_dtype(), p, "threshold_backward"))
    at::threshold_backward_out(cpu_out(r), cpu(grad), cpu(self), threshold);
  op.finish();
  return grad_input;
}

// ---- clamp --------------------------------------------------------------------------------------

bool is_nan_scalar(const at::Scalar& s) { return !s.isComplex() && s.toDouble() != s.toDouble(); }

// clamp with scalar bounds; a NaN bound makes every result NaN (as PyTorch's vectorised kernel).
template <class Op>
bool clamp_scalar_run(Op& op, const at::Tensor& r, const std::optional<at::Scalar>& lo,
                      const std::optional<at::Scalar>& hi) {
  if ((lo && is_nan_scalar(*lo)) || (hi && is_nan_scalar(*hi))) {
    if (r.numel()) at::fill_(const_cast<at::Tensor&>(r), std::numeric_limits<double>::quiet_NaN());
    return true;
  }
  const at::ScalarType common = op.common_dtype();
  nk_ew_params p{};
  if (lo) {
    auto v = scalar_as(*lo, common);
    if (!v) return false;
    p.lo = *v;
    p.has_lo = true;
  }
  if (hi) {
    auto v = scalar_as(*hi, common);
    if (!v) return false;
    p.hi = *v;
    p.has_hi = true;
  }
  return run(Family::Unary, NK_CLAMP, op, common, p, "clamp");
}

at::Tensor& neuron_clamp_out(const at::Tensor& self, const std::optional<at::Scalar>& min,
                             const std::optional<at::Scalar>& max, at::Tensor& out) {
  NEURON_NATIVE("aten::clamp.out");
  OutOp<at::meta::structured_clamp> op(out);
  op.meta(self, min ? at::OptionalScalarRef(&*min) : at::OptionalScalarRef(),
          max ? at::OptionalScalarRef(&*max) : at::OptionalScalarRef());
  const at::Tensor& r = op.maybe_get_output(0);
  if (!clamp_scalar_run(op, r, min, max)) at::clamp_out(cpu_out(r), cpu(self), min, max);
  op.finish();
  return out;
}

at::Tensor& neuron_clamp_min_out(const at::Tensor& self, const at::Scalar& min, at::Tensor& out) {
  NEURON_NATIVE("aten::clamp_min.out");
  OutOp<at::meta::structured_clamp_min> op(out);
  op.meta(self, min);
  const at::Tensor& r = op.maybe_get_output(0);
  if (!clamp_scalar_run(op, r, min, std::nullopt)) at::clamp_min_out(cpu_out(r), cpu(self), min);
  op.finish();
  return out;
}

at::Tensor& neuron_clamp_max_out(const at::Tensor& self, const at::Scalar& max, at::Tensor& out) {
  NEURON_NATIVE("aten::clamp_max.out");
  OutOp<at::meta::structured_clamp_max> op(out);
  op.meta(self, max);
  const at::Tensor& r = op.maybe_get_output(0);
  if (!clamp_scalar_run(op, r, std::nullopt, max)) at::clamp_max_out(cpu_out(r), cpu(self), max);
  op.finish();
  return out;
}

at::Tensor& neuron_clamp_tensor_out(const at::Tensor& self, const std::optional<at::Tensor>& min,
                                    const std::optional<at::Tensor>& max, at::Tensor& out) {
  NEURON_NATIVE("aten::clamp.Tensor_out");
  OutOp<at::meta::structured_clamp_Tensor> op(out);
  const bool has_min = min.has_value() && min->defined(), has_max = max.has_value() && max->defined();
  op.meta(self, has_min ? at::OptionalTensorRef(*min) : at::OptionalTensorRef(),
          has_max ? at::OptionalTensorRef(*max) : at::OptionalTensorRef());
  const at::Tensor& r = op.maybe_get_output(0);
  const at::ScalarType common = op.common_dtype();
  bool done;
  if (has_min && has_max) done = run(Family::Ternary, NK_CLAMP_TENSOR, op, common, nk_ew_params{}, "clamp");
  else if (has_min) done = run(Family::Binary, NK_MAXIMUM, op, common, nk_ew_params{}, "clamp");
  else done = run(Family::Binary, NK_MINIMUM, op, common, nk_ew_params{}, "clamp");
  if (!done) {
    std::optional<at::Tensor> cmin = has_min ? std::optional<at::Tensor>(cpu(*min)) : std::nullopt;
    std::optional<at::Tensor> cmax = has_max ? std::optional<at::Tensor>(cpu(*max)) : std::nullopt;
    at::clamp_out(cpu_out(r), cpu(self), cmin, cmax);
  }
  op.finish();
  return out;
}

// ---- pow ----------------------------------------------------------------------------------------

at::Tensor& neuron_pow_tensor_scalar_out(const at::Tensor& self, const at::Scalar& exponent, at::Tensor& out) {
  NEURON_NATIVE("aten::pow.Tensor_Scalar_out");
  OutOp<at::meta::structured_pow_Tensor_Scalar> op(out);
  op.meta(self, exponent);
  const at::Tensor& r = op.maybe_get_output(0);
  at::Tensor& rr = const_cast<at::Tensor&>(r);
  if (exponent.equal(0.0) || exponent.equal(false)) {
    rr.fill_(1);
  } else if (exponent.equal(1.0) || exponent.equal(true)) {
    rr.copy_(self);
  } else {
    const at::ScalarType common = op.common_dtype();
    std::optional<nk_scalar> e;
    // float/double take the exponent as a double, the reduced and integer types in their own type.
    if (exponent.isComplex()) e = std::nullopt;
    else if (common == at::kFloat || common == at::kDouble) e = float_scalar(exponent.to<double>());
    else e = scalar_as(exponent, common);
    nk_ew_params p{};
    if (e) p.value = *e;
    const bool cpu_rsqrt = is_reduced(common) && exponent.equal(-0.5);  // see neuron_rsqrt_out
    if (!e || common == at::kBool || cpu_rsqrt || !run(Family::Unary, NK_POW_SCALAR, op, common, p, "pow"))
      at::pow_out(cpu_out(r), cpu(self), exponent);
  }
  op.finish();
  return out;
}

at::Tensor& neuron_pow_scalar_out(const at::Scalar& self, const at::Tensor& exponent, at::Tensor& out) {
  NEURON_NATIVE("aten::pow.Scalar_out");
  OutOp<at::meta::structured_pow_Scalar> op(out);
  op.meta(self, exponent);
  at::Tensor& r = const_cast<at::Tensor&>(op.maybe_get_output(0));
  if (self.equal(1.0)) {
    r.fill_(1);
  } else {
    at::pow_out(r, at::native::wrapped_scalar_tensor(self), exponent);
  }
  op.finish();
  return out;
}

// ---- logical binary ops (not structured) --------------------------------------------------------

#define NEURON_LOGICAL_OUT(name, NKOP)                                                                 \
  at::Tensor& neuron_##name##_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {  \
    NEURON_NATIVE("aten::" #name ".out");                                                              \
    auto it = at::TensorIterator::comparison_op(out, self, other);                                     \
    if (!run(Family::Binary, NKOP, it, it.common_dtype(), nk_ew_params{}, #name))                      \
      at::name##_out(cpu_out(out), cpu(self), cpu(other));                                                 \
    return out;                                                                                        \
  }
NEURON_LOGICAL_OUT(logical_and, NK_LOGICAL_AND)
NEURON_LOGICAL_OUT(logical_or, NK_LOGICAL_OR)
NEURON_LOGICAL_OUT(logical_xor, NK_LOGICAL_XOR)

// ---- where and masked_fill ----------------------------------------------------------------------

at::Tensor& neuron_where_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other,
                             at::Tensor& out) {
  NEURON_NATIVE("aten::where.self_out");
  const auto result_type = at::native::result_type(self, other);
  TORCH_CHECK(out.scalar_type() == result_type, "Expected out type to be ", result_type, " but got ",
              out.scalar_type());
  if (condition.scalar_type() == at::kBool) {
    // CPU scalars go to the device, as PyTorch does for accelerators.
    auto dev = [&](const at::Tensor& t) { return t.is_cpu() && t.dim() == 0 ? t.to(out.device()) : t; };
    at::Tensor c = dev(condition), a = dev(self), b = dev(other);
    auto it = at::TensorIteratorConfig()
                  .check_all_same_dtype(false)
                  .add_output(out)
                  .add_const_input(c)
                  .add_const_input(a)
                  .add_const_input(b)
                  .build();
    if (run(Family::Ternary, NK_WHERE, it, result_type, nk_ew_params{}, "where")) return out;
  }
  at::where_out(cpu_out(out), cpu(condition), cpu(self), cpu(other));
  return out;
}

at::Tensor neuron_where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  NEURON_NATIVE("aten::where.self");
  c10::Device device = self.is_privateuseone() ? self.device()
                       : other.is_privateuseone() ? other.device()
                                                  : condition.device();
  auto result_type = at::native::result_type(self, other);
  at::Tensor ret = at::empty({0}, self.options().dtype(result_type).device(device));
  return neuron_where_out(condition, self, other, ret);
}

at::Tensor& masked_fill_impl(at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  bool native = mask.scalar_type() == at::kBool && !value.isComplex() && !self.is_complex() &&
                at::has_internal_overlap(self) != at::MemOverlap::Yes && mask.device() == self.device();
  if (native) {
    at::assert_no_partial_overlap(self, mask);
    c10::MaybeOwned<at::Tensor> m = at::expand_inplace(self, mask, "masked_fill_");
    std::optional<nk_scalar> v = scalar_as(value, self.scalar_type());
    if (v) {
      auto it = at::TensorIteratorConfig()
                    .set_check_mem_overlap(false)
                    .check_all_same_dtype(false)
                    .resize_outputs(false)
                    .add_output(self)
                    .add_const_input(self)
                    .add_const_input(*m)
                    .build();
      nk_ew_params p{};
      p.value = *v;
      if (run(Family::Binary, NK_MASKED_FILL, it, self.scalar_type(), p, "masked_fill_")) return self;
    }
  }
  cpu(self).masked_fill_(cpu(mask), value);
  return self;
}

at::Tensor& neuron_masked_fill_scalar(at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  NEURON_NATIVE("aten::masked_fill_.Scalar");
  return masked_fill_impl(self, mask, value);
}

at::Tensor& neuron_masked_fill_tensor(at::Tensor& self, const at::Tensor& mask, const at::Tensor& value) {
  NEURON_NATIVE("aten::masked_fill_.Tensor");
  TORCH_CHECK(value.dim() == 0, "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
              value.dim(), " dimension(s).");
  return masked_fill_impl(self, mask, value.item());
}

}  // namespace
}  // namespace torch_neuronx

using namespace torch_neuronx;

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.out", neuron_add_out);
  m.impl("sub.out", neuron_sub_out);
  m.impl("mul.out", neuron_mul_out);
  m.impl("div.out", neuron_div_out);
  m.impl("div.out_mode", neuron_div_out_mode);
  m.impl("neg.out", neuron_neg_out);
  m.impl("abs.out", neuron_abs_out);
  m.impl("exp.out", neuron_exp_out);
  m.impl("log.out", neuron_log_out);
  m.impl("sqrt.out", neuron_sqrt_out);
  m.impl("rsqrt.out", neuron_rsqrt_out);
  m.impl("reciprocal.out", neuron_reciprocal_out);
  m.impl("sin.out", neuron_sin_out);
  m.impl("cos.out", neuron_cos_out);
  m.impl("tanh.out", neuron_tanh_out);
  m.impl("sigmoid.out", neuron_sigmoid_out);
  m.impl("silu.out", neuron_silu_out);
  m.impl("gelu.out", neuron_gelu_out);
  m.impl("relu", neuron_relu);
  m.impl("relu_", neuron_relu_);
  m.impl("bitwise_not.out", neuron_bitwise_not_out);
  m.impl("logical_not.out", neuron_logical_not_out);
  m.impl("eq.Tensor_out", neuron_eq_tensor_out);
  m.impl("eq.Scalar_out", neuron_eq_scalar_out);
  m.impl("ne.Tensor_out", neuron_ne_tensor_out);
  m.impl("ne.Scalar_out", neuron_ne_scalar_out);
  m.impl("lt.Tensor_out", neuron_lt_tensor_out);
  m.impl("lt.Scalar_out", neuron_lt_scalar_out);
  m.impl("le.Tensor_out", neuron_le_tensor_out);
  m.impl("le.Scalar_out", neuron_le_scalar_out);
  m.impl("gt.Tensor_out", neuron_gt_tensor_out);
  m.impl("gt.Scalar_out", neuron_gt_scalar_out);
  m.impl("ge.Tensor_out", neuron_ge_tensor_out);
  m.impl("ge.Scalar_out", neuron_ge_scalar_out);
  m.impl("logical_and.out", neuron_logical_and_out);
  m.impl("logical_or.out", neuron_logical_or_out);
  m.impl("logical_xor.out", neuron_logical_xor_out);
  m.impl("bitwise_and.Tensor_out", neuron_bitwise_and_out);
  m.impl("bitwise_or.Tensor_out", neuron_bitwise_or_out);
  m.impl("bitwise_xor.Tensor_out", neuron_bitwise_xor_out);
  m.impl("where.self", neuron_where);
  m.impl("where.self_out", neuron_where_out);
  m.impl("masked_fill_.Scalar", neuron_masked_fill_scalar);
  m.impl("masked_fill_.Tensor", neuron_masked_fill_tensor);
  m.impl("clamp.out", neuron_clamp_out);
  m.impl("clamp.Tensor_out", neuron_clamp_tensor_out);
  m.impl("clamp_min.out", neuron_clamp_min_out);
  m.impl("clamp_min.Tensor_out", neuron_clamp_min_tensor_out);
  m.impl("clamp_max.out", neuron_clamp_max_out);
  m.impl("clamp_max.Tensor_out", neuron_clamp_max_tensor_out);
  m.impl("pow.Tensor_Scalar_out", neuron_pow_tensor_scalar_out);
  m.impl("pow.Tensor_Tensor_out", neuron_pow_tensor_tensor_out);
  m.impl("pow.Scalar_out", neuron_pow_scalar_out);
  m.impl("silu_backward.grad_input", neuron_silu_backward_out);
  // The functional silu_backward has a math decomposition for backends without a kernel; ours is fused.
  m.impl("silu_backward", TORCH_FN(Functional<neuron_silu_backward_out>));
  m.impl("gelu_backward.grad_input", neuron_gelu_backward_out);
  m.impl("sigmoid_backward.grad_input", neuron_sigmoid_backward_out);
  m.impl("tanh_backward.grad_input", neuron_tanh_backward_out);
  m.impl("threshold_backward.grad_input", neuron_threshold_backward_out);
  // Functional and in-place overloads of the structured kernels above (one meta function and one dispatch per call).
  m.impl("add_.Tensor", TORCH_FN(Inplace<neuron_add_out>));
  m.impl("sub_.Tensor", TORCH_FN(Inplace<neuron_sub_out>));
  m.impl("mul_.Tensor", TORCH_FN(Inplace<neuron_mul_out>));
  m.impl("div_.Tensor", TORCH_FN(Inplace<neuron_div_out>));
  m.impl("div_.Tensor_mode", TORCH_FN(Inplace<neuron_div_out_mode>));
  m.impl("neg_", TORCH_FN(Inplace<neuron_neg_out>));
  m.impl("exp_", TORCH_FN(Inplace<neuron_exp_out>));
  m.impl("log_", TORCH_FN(Inplace<neuron_log_out>));
  m.impl("sqrt_", TORCH_FN(Inplace<neuron_sqrt_out>));
  m.impl("rsqrt_", TORCH_FN(Inplace<neuron_rsqrt_out>));
  m.impl("reciprocal_", TORCH_FN(Inplace<neuron_reciprocal_out>));
  m.impl("sin_", TORCH_FN(Inplace<neuron_sin_out>));
  m.impl("cos_", TORCH_FN(Inplace<neuron_cos_out>));
  m.impl("tanh_", TORCH_FN(Inplace<neuron_tanh_out>));
  m.impl("sigmoid_", TORCH_FN(Inplace<neuron_sigmoid_out>));
  m.impl("silu_", TORCH_FN(Inplace<neuron_silu_out>));
  m.impl("gelu_", TORCH_FN(Inplace<neuron_gelu_out>));
  m.impl("clamp_", TORCH_FN(Inplace<neuron_clamp_out>));
  m.impl("clamp_min_", TORCH_FN(Inplace<neuron_clamp_min_out>));
  m.impl("clamp_max_", TORCH_FN(Inplace<neuron_clamp_max_out>));
  m.impl("pow_.Scalar", TORCH_FN(Inplace<neuron_pow_tensor_scalar_out>));
  m.impl("pow_.Tensor", TORCH_FN(Inplace<neuron_pow_tensor_tensor_out>));
  m.impl("add.Tensor", TORCH_FN(Functional<neuron_add_out>));
  m.impl("sub.Tensor", TORCH_FN(Functional<neuron_sub_out>));
  m.impl("mul.Tensor", TORCH_FN(Functional<neuron_mul_out>));
  m.impl("div.Tensor", TORCH_FN(Functional<neuron_div_out>));
  m.impl("div.Tensor_mode", TORCH_FN(Functional<neuron_div_out_mode>));
  m.impl("neg", TORCH_FN(Functional<neuron_neg_out>));
  m.impl("exp", TORCH_FN(Functional<neuron_exp_out>));
  m.impl("log", TORCH_FN(Functional<neuron_log_out>));
  m.impl("sqrt", TORCH_FN(Functional<neuron_sqrt_out>));
  m.impl("rsqrt", TORCH_FN(Functional<neuron_rsqrt_out>));
  m.impl("reciprocal", TORCH_FN(Functional<neuron_reciprocal_out>));
  m.impl("sin", TORCH_FN(Functional<neuron_sin_out>));
  m.impl("cos", TORCH_FN(Functional<neuron_cos_out>));
  m.impl("tanh", TORCH_FN(Functional<neuron_tanh_out>));
  m.impl("sigmoid", TORCH_FN(Functional<neuron_sigmoid_out>));
  m.impl("silu", TORCH_FN(Functional<neuron_silu_out>));
  m.impl("gelu", TORCH_FN(Functional<neuron_gelu_out>));
  m.impl("bitwise_not", TORCH_FN(Functional<neuron_bitwise_not_out>));
  m.impl("eq.Tensor", TORCH_FN(Functional<neuron_eq_tensor_out>));
  m.impl("eq.Scalar", TORCH_FN(Functional<neuron_eq_scalar_out>));
  m.impl("ne.Tensor", TORCH_FN(Functional<neuron_ne_tensor_out>));
  m.impl("ne.Scalar", TORCH_FN(Functional<neuron_ne_scalar_out>));
  m.impl("lt.Tensor", TORCH_FN(Functional<neuron_lt_tensor_out>));
  m.impl("lt.Scalar", TORCH_FN(Functional<neuron_lt_scalar_out>));
  m.impl("le.Tensor", TORCH_FN(Functional<neuron_le_tensor_out>));
  m.impl("le.Scalar", TORCH_FN(Functional<neuron_le_scalar_out>));
  m.impl("gt.Tensor", TORCH_FN(Functional<neuron_gt_tensor_out>));
  m.impl("gt.Scalar", TORCH_FN(Functional<neuron_gt_scalar_out>));
  m.impl("ge.Tensor", TORCH_FN(Functional<neuron_ge_tensor_out>));
  m.impl("ge.Scalar", TORCH_FN(Functional<neuron_ge_scalar_out>));
  m.impl("bitwise_and.Tensor", TORCH_FN(Functional<neuron_bitwise_and_out>));
  m.impl("bitwise_or.Tensor", TORCH_FN(Functional<neuron_bitwise_or_out>));
  m.impl("bitwise_xor.Tensor", TORCH_FN(Functional<neuron_bitwise_xor_out>));
  m.impl("clamp", TORCH_FN(Functional<neuron_clamp_out>));
  m.impl("clamp.Tensor", TORCH_FN(Functional<neuron_clamp_tensor_out>));
  m.impl("clamp_min", TORCH_FN(Functional<neuron_clamp_min_out>));
  m.impl("clamp_min.Tensor", TORCH_FN(Functional<neuron_clamp_min_tensor_out>));
  m.impl("clamp_max", TORCH_FN(Functional<neuron_clamp_max_out>));
  m.impl("clamp_max.Tensor", TORCH_FN(Functional<neuron_clamp_max_tensor_out>));
  m.impl("pow.Tensor_Scalar", TORCH_FN(Functional<neuron_pow_tensor_scalar_out>));
  m.impl("pow.Tensor_Tensor", TORCH_FN(Functional<neuron_pow_tensor_tensor_out>));
  m.impl("pow.Scalar", TORCH_FN(Functional<neuron_pow_scalar_out>));
  m.impl("gelu_backward", TORCH_FN(Functional<neuron_gelu_backward_out>));
  m.impl("sigmoid_backward", TORCH_FN(Functional<neuron_sigmoid_backward_out>));
  m.impl("tanh_backward", TORCH_FN(Functional<neuron_tanh_backward_out>));
  m.impl("threshold_backward", TORCH_FN(Functional<neuron_threshold_backward_out>));
}
