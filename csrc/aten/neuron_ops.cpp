// Operator registrations for the neuron device: tensor life, copies, random ops, the zero-copy CPU
// fallback for every other operator, and autocast.
#include "aten/neuron_aten.h"
#include "runtime/neuron_stats.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/autocast_mode.h>
#include <ATen/native/DistributionTemplates.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace torch_neuronx {

// ---- op counters ----------------------------------------------------------------------------------

struct OpCount {
  std::atomic<int64_t> native{0}, fallback{0};
};

namespace {
std::mutex g_count_mu;
std::unordered_map<std::string, std::unique_ptr<OpCount>>& counts() {
  static auto* m = new std::unordered_map<std::string, std::unique_ptr<OpCount>>();
  return *m;
}
}  // namespace

OpCount& count_slot(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_count_mu);
  auto& slot = counts()[op];
  if (!slot) slot = std::make_unique<OpCount>();
  return *slot;
}

void count_native_slot(OpCount& slot) { slot.native.fetch_add(1, std::memory_order_relaxed); }

namespace {
// Native calls of the process so far, for the statistics segment's refresher thread (neuron-top): summed
// there every interval rather than counted per core on the hot path, which stays one relaxed add.
uint64_t native_calls_total() {
  std::lock_guard<std::mutex> lock(g_count_mu);
  uint64_t total = 0;
  for (auto& kv : counts()) total += static_cast<uint64_t>(kv.second->native.load(std::memory_order_relaxed));
  return total;
}
const bool g_stats_source_registered = (nrn_stats_set_native_source(&native_calls_total), true);
}  // namespace

namespace {
// The counter of a fallback operator, cached per thread so the hot path takes no lock.
OpCount& fallback_slot(const c10::OperatorHandle& op, std::string* name) {
  thread_local std::unordered_map<const void*, OpCount*> cache;
  const void* key = &op.schema();
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  OpCount* slot = &count_slot(*name);
  cache.emplace(key, slot);
  return *slot;
}
}  // namespace

std::map<std::string, std::pair<int64_t, int64_t>> op_counts() {
  std::lock_guard<std::mutex> lock(g_count_mu);
  std::map<std::string, std::pair<int64_t, int64_t>> out;
  for (auto& kv : counts()) out[kv.first] = {kv.second->native.load(), kv.second->fallback.load()};
  return out;
}

void reset_op_counts() {
  std::lock_guard<std::mutex> lock(g_count_mu);
  for (auto& kv : counts()) {
    kv.second->native = 0;
    kv.second->fallback = 0;
  }
}

// ---- descriptors and aliases ----------------------------------------------------------------------

bool nk_dtype_of(at::ScalarType st, nk_dtype* out) {
  switch (st) {
    case at::kBool: *out = NK_BOOL; return true;
    case at::kByte: *out = NK_U8; return true;
    case at::kChar: *out = NK_I8; return true;
    case at::kShort: *out = NK_I16; return true;
    case at::kInt: *out = NK_I32; return true;
    case at::kLong: *out = NK_I64; return true;
    case at::kHalf: *out = NK_F16; return true;
    case at::kBFloat16: *out = NK_BF16; return true;
    case at::kFloat: *out = NK_F32; return true;
    case at::kDouble: *out = NK_F64; return true;
    case at::kUInt16: *out = NK_U16; return true;
    case at::kUInt32: *out = NK_U32; return true;
    case at::kUInt64: *out = NK_U64; return true;
    default: return false;
  }
}

bool may_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return false;
  if (a.has_storage() && b.has_storage()) {
    const auto* a0 = static_cast<const char*>(a.storage().data());
    const auto* b0 = static_cast<const char*>(b.storage().data());
    if (a0 != nullptr && b0 != nullptr &&
        (a0 + a.storage().nbytes() <= b0 || b0 + b.storage().nbytes() <= a0))
      return false;
  }
  return at::get_overlap_status(a, b) != at::MemOverlapStatus::No;
}

bool to_nk(const at::Tensor& t, nk_tensor* out) {
  if (t.is_conj() || t.is_neg() || t.dim() > NK_MAX_DIMS || t.layout() != at::kStrided) return false;
  if (!nk_dtype_of(t.scalar_type(), &out->dtype)) return false;
  out->data = t.numel() ? t.data_ptr() : nullptr;
  out->ndim = static_cast<int32_t>(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) {
    out->sizes[i] = t.size(i);
    out->strides[i] = t.stride(i);
  }
  return true;
}

nk_tensor nk_desc(const at::Tensor& t, const char* op) {
  nk_tensor d;
  TORCH_CHECK(to_nk(t, &d), op, ": cannot describe a tensor of ", t.sizes(), " ", t.scalar_type());
  return d;
}

void raise_kernel_status(nk_status s, const char* op, const at::Tensor& t) {
  TORCH_CHECK(false, op, ": neuron kernel failed (status ", static_cast<int>(s), ") for a tensor of shape ",
              t.sizes(), ", strides ", t.strides(), " and dtype ", t.scalar_type());
}

namespace {

void noop_delete(void*) {}

// The allocator of alias storages: device memory, labelled CPU. A CPU kernel that resizes an alias
// storage then makes CPU-device views of the new memory, as it would of its own allocations.
struct AliasAllocator final : public c10::Allocator {
  at::DataPtr allocate(size_t nbytes) override {
    at::DataPtr p = neuron_allocator()->allocate(nbytes);
    p.unsafe_set_device(at::Device(at::kCPU));
    return p;
  }
  c10::DeleterFnPtr raw_deleter() const override { return neuron_allocator()->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    neuron_allocator()->copy_data(dest, src, count);
  }
};

c10::Allocator* alias_allocator() {
  static AliasAllocator a;
  return &a;
}

// CPU aliases of neuron storages for one fallback call. Tensors sharing a neuron storage share one
// alias storage, so PyTorch's CPU overlap checks see them as the same memory. The alias storage is
// resizable with the neuron allocator, so a CPU kernel that resizes an out= argument allocates device
// memory, which is handed back to the neuron storage afterwards.
struct AliasSet {
  struct Entry {
    c10::Storage neuron, alias;
    void* original_ptr;
    size_t original_nbytes;
  };
  std::vector<Entry> entries;

  const c10::Storage& alias_of(const c10::Storage& s) {
    for (auto& e : entries)
      if (e.neuron.unsafeGetStorageImpl() == s.unsafeGetStorageImpl()) return e.alias;
    void* p = s.unsafeGetStorageImpl()->mutable_data();
    c10::Storage alias(c10::Storage::use_byte_size_t(), s.nbytes(),
                       at::DataPtr(p, p, &noop_delete, at::Device(at::kCPU)), alias_allocator(), /*resizable=*/true);
    entries.push_back({s, std::move(alias), p, s.nbytes()});
    return entries.back().alias;
  }

  at::Tensor cpu(const at::Tensor& t) {
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(alias_of(t.storage())),
                                                     c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    at::Tensor out(std::move(impl));
    if (t.is_conj()) out._set_conj(true);
    if (t.is_neg()) out._set_neg(true);
    return out;
  }

  // Neuron view of a CPU tensor living on one of the alias storages, or an undefined tensor.
  at::Tensor neuron_view(const at::Tensor& r) {
    for (auto& e : entries) {
      if (r.storage().unsafeGetStorageImpl() != e.alias.unsafeGetStorageImpl()) continue;
      auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(e.neuron),
                                                       c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), r.dtype());
      impl->set_sizes_and_strides(r.sizes(), r.strides(), r.storage_offset());
      at::Tensor out(std::move(impl));
      if (r.is_conj()) out._set_conj(true);
      if (r.is_neg()) out._set_neg(true);
      return out;
    }
    return at::Tensor();
  }

  // Hands memory that a CPU kernel reallocated (by resizing an alias storage) to the neuron storage.
  void adopt_resized() {
    for (auto& e : entries) {
      auto* a = e.alias.unsafeGetStorageImpl();
      if (a->data() == e.original_ptr && a->nbytes() == e.original_nbytes) continue;
      auto* n = e.neuron.unsafeGetStorageImpl();
      size_t nbytes = a->nbytes();
      at::DataPtr fresh = a->set_data_ptr(at::DataPtr(nullptr, at::Device(at::kCPU)));
      if (fresh.get_deleter() == &noop_delete) {
        // Shrunk in place without reallocation: only the byte count changed.
        n->set_nbytes(nbytes);
        continue;
      }
      fresh.unsafe_set_device(e.neuron.device());
      n->set_data_ptr_noswap(std::move(fresh));
      n->set_nbytes(nbytes);
    }
  }
};

}  // namespace

at::Tensor cpu_alias(const at::Tensor& t) {
  // The alias keeps the neuron storage alive through its own reference.
  AliasSet set;
  at::Tensor a = set.cpu(t);
  return a;
}

// A CPU generator keyed by the neuron generator's state, which it advances: random ops that run on
// the CPU still follow torch.neuron.manual_seed.
at::Generator cpu_generator_from(NeuronGeneratorImpl* g) {
  std::lock_guard<std::mutex> lock(g->mutex_);
  uint64_t* off = g->offset_ptr();
  uint64_t x = g->seed_value() ^ (*off * 0x9E3779B97F4A7C15ull);
  *off += 4;
  // splitmix64 finaliser: nearby (seed, offset) pairs give unrelated CPU seeds.
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return at::detail::createCPUGenerator(x);
}

namespace {

// ---- tensor life ----------------------------------------------------------------------------------

c10::Device resolve_device(std::optional<c10::Device> device) {
  c10::Device d = device.value_or(c10::Device(c10::DeviceType::PrivateUse1, -1));
  TORCH_CHECK(d.type() == c10::DeviceType::PrivateUse1, "expected a neuron device, got ", d);
  if (d.index() < 0) return c10::Device(c10::DeviceType::PrivateUse1, current_device());
  check_device_index(d.index());
  return d;
}

void check_factory(std::optional<at::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.has_value() || !*pin_memory, "Only dense CPU tensors can be pinned");
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided, "neuron tensors support only the strided layout, got ",
              *layout);
}

at::Tensor neuron_empty(at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                        std::optional<c10::Device> device, std::optional<bool> pin_memory,
                        std::optional<at::MemoryFormat> memory_format) {
  NEURON_NATIVE("aten::empty.memory_format");
  check_factory(layout, pin_memory);
  c10::DeviceGuard guard(resolve_device(device));
  return at::detail::empty_generic(size, neuron_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor neuron_empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                                std::optional<at::Layout> layout, std::optional<c10::Device> device,
                                std::optional<bool> pin_memory) {
  NEURON_NATIVE("aten::empty_strided");
  check_factory(layout, pin_memory);
  c10::DeviceGuard guard(resolve_device(device));
  return at::detail::empty_strided_generic(size, stride, neuron_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor neuron_as_strided(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride,
                             std::optional<int64_t> storage_offset) {
  NEURON_NATIVE("aten::as_strided");
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor neuron_view(const at::Tensor& self, at::IntArrayRef size) {
  NEURON_NATIVE("aten::view");
  return at::native::view(self, size);
}

at::Tensor neuron_reshape_alias(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride) {
  NEURON_NATIVE("aten::_reshape_alias");
  return at::native::_reshape_alias(self, size, stride);
}

// Device memory is host-addressable, so PyTorch's generic resize logic applies; it allocates through
// the storage's allocator (ours), on the tensor's device.
const at::Tensor& neuron_resize_(const at::Tensor& self, at::IntArrayRef size,
                                 std::optional<at::MemoryFormat> memory_format) {
  NEURON_NATIVE("aten::resize_");
  c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& neuron_set_storage(at::Tensor& self, at::Storage source, int64_t storage_offset, at::IntArrayRef size,
                               at::IntArrayRef stride) {
  NEURON_NATIVE("aten::set_.source_Storage_storage_offset");
  c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& neuron_set_source_storage(at::Tensor& self, at::Storage source) {
  NEURON_NATIVE("aten::set_.source_Storage");
  return at::native::set_(self, std::move(source));
}

at::Tensor& neuron_set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  NEURON_NATIVE("aten::set_.source_Tensor");
  return at::native::set_tensor_(self, source);
}

at::Tensor& neuron_set_empty(at::Tensor& self) {
  NEURON_NATIVE("aten::set_");
  c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, neuron_allocator(), /*resizable=*/true);
  self.set_(storage, 0, {0}, {});
  return self;
}

// ---- copies and fills -----------------------------------------------------------------------------

at::Tensor neuron_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  NEURON_NATIVE("aten::_copy_from");
  if (dst.numel() == 0) return dst;
  at::Tensor src = self.sizes() == dst.sizes() ? self : self.expand(dst.sizes());
  nk_tensor d, s;
  // Same storage or an overlapping destination: PyTorch's CPU copy handles (and rejects) those cases.
  bool simple = !src.storage().is_alias_of(dst.storage()) && at::has_internal_overlap(dst) != at::MemOverlap::Yes;
  if (simple && to_nk(dst, &d) && to_nk(src, &s)) {
    nk_status st = nk_copy(&d, &s);
    if (st == NK_SUCCESS) return dst;
    if (st != NK_UNSUPPORTED) raise_kernel_status(st, "copy_", dst);
  }
  AliasSet set;
  at::Tensor d_cpu = dst.is_cpu() ? dst : set.cpu(dst);
  at::Tensor s_cpu = src.is_cpu() ? src : set.cpu(src);
  d_cpu.copy_(s_cpu);
  return dst;
}

at::Tensor neuron_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  NEURON_NATIVE("aten::_copy_from_and_resize");
  dst.resize_(self.sizes());
  return neuron_copy_from(self, dst, false);
}

at::Scalar neuron_local_scalar_dense(const at::Tensor& self) {
  NEURON_NATIVE("aten::_local_scalar_dense");
  NRN_CHECK(nrn_device_synchronize(self.device().index()));
  return at::native::_local_scalar_dense_cpu(cpu_alias(self));
}

// Raises like PyTorch CPU when the value does not fit the dtype (e.g. 300 into uint8).
void check_fill_value(const at::Scalar& v, at::ScalarType st) {
  switch (st) {
    case at::kBool: (void)v.to<bool>(); break;
    case at::kByte: (void)v.to<uint8_t>(); break;
    case at::kChar: (void)v.to<int8_t>(); break;
    case at::kShort: (void)v.to<int16_t>(); break;
    case at::kInt: (void)v.to<int32_t>(); break;
    case at::kLong: (void)v.to<int64_t>(); break;
    case at::kHalf: (void)v.to<at::Half>(); break;
    case at::kBFloat16: (void)v.to<at::BFloat16>(); break;
    case at::kFloat: (void)v.to<float>(); break;
    case at::kDouble: (void)v.to<double>(); break;
    default: break;
  }
}

at::Tensor& fill_impl(at::Tensor& self, const at::Scalar& v) {
  nk_tensor t;
  bool simple_value = v.isFloatingPoint() || v.isBoolean() || (v.isIntegral(false) && !v.isUnsigned());
  if (simple_value && at::has_internal_overlap(self) != at::MemOverlap::Yes && to_nk(self, &t)) {
    check_fill_value(v, self.scalar_type());
    nk_scalar s{};
    if (v.isFloatingPoint()) {
      s.is_float = true;
      s.f = v.toDouble();
    } else {
      s.i = v.isBoolean() ? static_cast<int64_t>(v.toBool()) : v.toLong();
    }
    nk_status st = nk_fill(&t, s);
    if (st == NK_SUCCESS) return self;
    if (st != NK_UNSUPPORTED) raise_kernel_status(st, "fill_", self);
  }
  cpu_alias(self).fill_(v);
  return self;
}

at::Tensor& neuron_fill_scalar(at::Tensor& self, const at::Scalar& v) {
  NEURON_NATIVE("aten::fill_.Scalar");
  return fill_impl(self, v);
}

at::Tensor& neuron_fill_tensor(at::Tensor& self, const at::Tensor& v) {
  NEURON_NATIVE("aten::fill_.Tensor");
  TORCH_CHECK(v.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ", v.dim(),
              " dimensions.");
  return fill_impl(self, v.item());
}

at::Tensor& neuron_zero_(at::Tensor& self) {
  NEURON_NATIVE("aten::zero_");
  return fill_impl(self, at::Scalar(0));
}

// ---- random ---------------------------------------------------------------------------------------
// Argument checks and range computation come from PyTorch's distribution templates (so errors match
// CPU); the kernels run the library's Philox generator under the neuron generator's lock.

template <class F>
void run_rng(const at::Tensor& self, std::optional<at::Generator> gen, const char* op, F&& kernel,
             void (*cpu_slow)(at::Tensor&, at::Generator&)) {
  NeuronGeneratorImpl* g = get_generator(gen, self.device().index());
  nk_tensor t;
  if (to_nk(self, &t)) {
    nk_status st;
    {
      std::lock_guard<std::mutex> lock(g->mutex_);
      st = kernel(&t, g->seed_value(), g->offset_ptr());
    }
    if (st == NK_SUCCESS) return;
    if (st != NK_UNSUPPORTED) raise_kernel_status(st, op, self);
  }
  at::Generator cg = cpu_generator_from(g);
  at::Tensor a = cpu_alias(self);
  cpu_slow(a, cg);
}

thread_local double tl_a, tl_b;  // scalar arguments for the CPU slow paths below

template <typename RNG>
struct UniformKernel {
  void operator()(at::TensorIteratorBase& iter, double from, double to, std::optional<at::Generator> gen) {
    const at::Tensor& self = iter.tensor(0);
    tl_a = from;
    tl_b = to;
    run_rng(self, gen, "uniform_",
            [&](nk_tensor* t, uint64_t seed, uint64_t* off) { return nk_rng_uniform(t, seed, off, from, to); },
            [](at::Tensor& a, at::Generator& g) { a.uniform_(tl_a, tl_b, g); });
  }
};

template <typename RNG>
struct NormalKernel {
  void operator()(const at::TensorBase& base, double mean, double std, std::optional<at::Generator> gen) {
    at::Tensor self(base);
    tl_a = mean;
    tl_b = std;
    run_rng(self, gen, "normal_",
            [&](nk_tensor* t, uint64_t seed, uint64_t* off) { return nk_rng_normal(t, seed, off, mean, std); },
            [](at::Tensor& a, at::Generator& g) { a.normal_(tl_a, tl_b, g); });
  }
};

uint64_t default_random_range(at::ScalarType st) {
  switch (st) {
    case at::kBool: return 2;
    case at::kByte: return 256;
    case at::kChar: return 128;
    case at::kShort: return 1ull << 15;
    case at::kInt: return 1ull << 31;
    case at::kUInt16: return 1ull << 16;
    case at::kUInt32: return 1ull << 32;
    case at::kHalf: return (1ull << 11) + 1;
    case at::kBFloat16: return (1ull << 8) + 1;
    case at::kFloat: return (1ull << 24) + 1;
    case at::kDouble: return (1ull << 53) + 1;
    default: return 1ull << 63;  // int64, uint64: [0, 2^63 - 1]
  }
}

template <typename RNG>
struct RandomFromToKernel {
  void operator()(at::TensorIteratorBase& iter, uint64_t range, int64_t base, std::optional<at::Generator> gen) {
    const at::Tensor& self = iter.tensor(0);
    run_rng(self, gen, "random_",
            [&](nk_tensor* t, uint64_t seed, uint64_t* off) { return nk_rng_random(t, seed, off, base, range); },
            nullptr);
  }
  // The full 64-bit range: the kernel's range argument is at most 2^64 - 1, one value short of it.
  void operator()(at::TensorIteratorBase& iter, std::optional<at::Generator> gen) {
    (*this)(iter, UINT64_MAX, INT64_MIN, gen);
  }
};

template <typename RNG>
struct RandomKernel {
  void operator()(at::TensorIteratorBase& iter, std::optional<at::Generator> gen) {
    const at::Tensor& self = iter.tensor(0);
    uint64_t range = default_random_range(self.scalar_type());
    run_rng(self, gen, "random_",
            [&](nk_tensor* t, uint64_t seed, uint64_t* off) { return nk_rng_random(t, seed, off, 0, range); },
            nullptr);
  }
};

template <typename RNG>
struct BernoulliKernel {
  void operator()(const at::TensorBase& base, double p, std::optional<at::Generator> gen) {
    at::Tensor self(base);
    tl_a = p;
    run_rng(self, gen, "bernoulli_",
            [&](nk_tensor* t, uint64_t seed, uint64_t* off) { return nk_rng_bernoulli(t, seed, off, p); },
            [](at::Tensor& a, at::Generator& g) { a.bernoulli_(tl_a, g); });
  }
  void operator()(const at::TensorBase& base, const at::TensorBase& p_base, std::optional<at::Generator> gen) {
    at::Tensor self(base);
    at::Tensor p = at::Tensor(p_base).expand(self.sizes());
    nk_tensor pt;
    NeuronGeneratorImpl* g = get_generator(gen, self.device().index());
    nk_tensor t;
    if (to_nk(self, &t) && to_nk(p, &pt)) {
      nk_status st;
      {
        std::lock_guard<std::mutex> lock(g->mutex_);
        st = nk_rng_bernoulli_tensor(&t, &pt, g->seed_value(), g->offset_ptr());
      }
      if (st == NK_SUCCESS) return;
      if (st != NK_UNSUPPORTED) raise_kernel_status(st, "bernoulli_", self);
    }
    at::Generator cg = cpu_generator_from(g);
    cpu_alias(self).bernoulli_(p.is_cpu() ? p : cpu_alias(p), cg);
  }
};

struct NeuronRNG {};  // tag for the templates; the generator type is resolved inside the kernels

at::Tensor& neuron_uniform_(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  NEURON_NATIVE("aten::uniform_");
  return at::native::templates::uniform_impl_<UniformKernel, NeuronRNG>(self, from, to, gen);
}

at::Tensor& neuron_normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  NEURON_NATIVE("aten::normal_");
  return at::native::templates::normal_impl_<NormalKernel, NeuronRNG>(self, mean, std, gen);
}

at::Tensor& neuron_random_(at::Tensor& self, std::optional<at::Generator> gen) {
  NEURON_NATIVE("aten::random_");
  return at::native::templates::random_impl<RandomKernel, NeuronRNG>(self, gen);
}

at::Tensor& neuron_random_from(at::Tensor& self, int64_t from, std::optional<int64_t> to,
                               std::optional<at::Generator> gen) {
  NEURON_NATIVE("aten::random_.from");
  return at::native::templates::random_from_to_impl<RandomFromToKernel, NeuronRNG>(self, from, to, gen);
}

at::Tensor& neuron_random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  NEURON_NATIVE("aten::random_.to");
  return at::native::templates::random_from_to_impl<RandomFromToKernel, NeuronRNG>(self, 0, to, gen);
}

at::Tensor& neuron_bernoulli_float(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  NEURON_NATIVE("aten::bernoulli_.float");
  return at::native::templates::bernoulli_impl_<BernoulliKernel, NeuronRNG>(self, p, gen);
}

at::Tensor& neuron_bernoulli_tensor(at::Tensor& self, const at::Tensor& p, std::optional<at::Generator> gen) {
  NEURON_NATIVE("aten::bernoulli_.Tensor");
  return at::native::templates::bernoulli_impl_<BernoulliKernel, NeuronRNG>(self, p, gen);
}

at::Tensor neuron_bernoulli(const at::Tensor& self, std::optional<at::Generator> gen) {
  NEURON_NATIVE("aten::bernoulli");
  at::Tensor out = at::empty_like(self, at::MemoryFormat::Contiguous);
  return neuron_bernoulli_tensor(out, self, gen);
}

at::Tensor& neuron_randperm_out(int64_t n, std::optional<at::Generator> gen, at::Tensor& out) {
  NEURON_NATIVE("aten::randperm.generator_out");
  TORCH_CHECK(n >= 0, "n must be non-negative, got", n);
  at::native::resize_output(out, {n});
  NeuronGeneratorImpl* g = get_generator(gen, out.device().index());
  nk_tensor t;
  TORCH_CHECK(to_nk(out, &t), "randperm: unsupported dtype ", out.scalar_type(), " on neuron");
  nk_status st;
  {
    std::lock_guard<std::mutex> lock(g->mutex_);
    st = nk_rng_randperm(&t, n, g->seed_value(), g->offset_ptr());
  }
  if (st != NK_SUCCESS) raise_kernel_status(st, "randperm", out);
  return out;
}

// Exp(lambda) as -log(1 - u) / lambda from the device's uniform draws in [0, 1) (so 1 - u lies in (0, 1]):
// the transform runs as native element-wise ops. Float dtypes only, like the CPU's.
at::Tensor& neuron_exponential_(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  NEURON_NATIVE("aten::exponential_");
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  if (self.numel() == 0) return self;
  if (!at::isFloatingType(self.scalar_type())) {
    at::Generator cg = cpu_generator_from(get_generator(gen, self.device().index()));
    cpu_alias(self).exponential_(lambd, cg);  // raises the CPU's error for this dtype
    return self;
  }
  // Half types draw in float: 1 - u rounded to bfloat16 could be 0 (an infinite sample).
  const bool half = self.scalar_type() == at::kHalf || self.scalar_type() == at::kBFloat16;
  at::Tensor t = half ? at::empty(self.sizes(), self.options().dtype(at::kFloat)) : self;
  t.uniform_(0.0, 1.0, gen);
  t.neg_().add_(1.0).log_().div_(-lambd);
  if (half) self.copy_(t);
  return self;
}

// The CPU's sampling without replacement (and of one sample): argmax (topk) of p / q with q ~ Exp(1),
// the Gumbel-max trick, on device ops. Sampling with replacement of several samples, and any input the
// CPU rejects, runs the CPU kernel with a CPU generator drawn from the neuron generator.
at::Tensor neuron_multinomial(const at::Tensor& self, int64_t n_sample, bool replacement,
                              std::optional<at::Generator> gen) {
  NEURON_NATIVE("aten::multinomial");
  const bool shape_ok = (self.dim() == 1 || self.dim() == 2) && at::isFloatingType(self.scalar_type()) &&
                        n_sample > 0 && self.numel() > 0 && self.size(-1) <= (int64_t{1} << 24) &&
                        (replacement ? n_sample == 1 : n_sample <= self.size(-1));
  if (shape_ok) {
    const bool valid = ((self.max() < INFINITY) & (self.min() >= 0)).item<bool>();
    const bool zero_rows = self.dim() == 1 ? (self.sum() == 0).item<bool>()
                                           : (self.sum(1) == 0).sum().item<int64_t>() != 0;
    if (valid && !zero_rows) {
      at::Tensor q = at::empty_like(self).exponential_(1, gen);
      at::div_out(q, self, q);
      if (n_sample == 1) return at::argmax(q, -1, true);
      return std::get<1>(at::topk(q, n_sample));
    }
  }
  at::Generator cg = cpu_generator_from(get_generator(gen, self.device().index()));
  at::Tensor r = at::multinomial(cpu_alias(self), n_sample, replacement, cg);
  return r.to(self.device());
}

std::tuple<at::Tensor, at::Tensor> neuron_native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  NEURON_NATIVE("aten::native_dropout");
  if (input.numel() == 0) return {input, at::empty_like(input, input.options().dtype(at::kBool))};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  double p1m = 1. - p;
  double scale = p1m == 0 ? 0. : 1. / p1m;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(p1m);
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask};
}

void neuron_record_stream(at::Tensor& self, c10::Stream s) {
  NEURON_NATIVE("aten::record_stream");
  neuron_allocator()->recordStream(self.storage().data_ptr(), s);
}

// Lets `cpu_param.data = neuron_tensor` (and back) work, as it does between CPU and CUDA: both are
// dense strided tensors whose TensorImpl metadata can be shallow-copied.
bool neuron_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && !t.is_quantized() && (t.is_cpu() || t.is_privateuseone());
  };
  if (self.key_set() == from.key_set()) return true;
  return dense(self) && dense(from);
}

// ---- the zero-copy CPU fallback -------------------------------------------------------------------

bool fallback_forbidden() {
  static const bool forbidden = [] {
    const char* v = std::getenv("TORCH_NEURONX_DISABLE_FALLBACK");
    return v && *v && std::string(v) != "0";
  }();
  return forbidden;
}

// Counts a call that runs a CPU kernel in place of a missing neuron kernel, like the fallback does.
void count_cpu_run(const char* op) {
  static thread_local std::unordered_map<const char*, OpCount*> slots;
  OpCount*& slot = slots[op];
  if (!slot) slot = &count_slot(op);
  slot->fallback.fetch_add(1, std::memory_order_relaxed);
  TORCH_CHECK(!fallback_forbidden(), "neuron: operator ", op, " has no native neuron kernel and "
              "TORCH_NEURONX_DISABLE_FALLBACK is set, which forbids running it on the CPU");
}

bool is_optional_generator(const c10::Argument& arg) {
  const auto& t = arg.type();
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  if (auto opt = t->cast<c10::OptionalType>()) return opt->getElementType()->kind() == c10::TypeKind::GeneratorType;
  return false;
}

struct FallbackCall {
  AliasSet aliases;
  std::vector<std::pair<at::Tensor, at::Tensor>> tensors;  // (neuron argument, its CPU alias)
  std::vector<at::Tensor> cpu_inputs;                      // non-neuron tensor arguments, passed as is
  c10::DeviceIndex device = -1;

  at::Tensor in(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (!t.is_privateuseone()) {
      cpu_inputs.push_back(t);
      return t;
    }
    if (device < 0) device = t.device().index();
    at::Tensor a = aliases.cpu(t);
    tensors.emplace_back(t, a);
    return a;
  }

  c10::IValue in(const c10::IValue& v) {
    if (v.isTensor()) return in(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> l = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(l.size());
      for (const at::Tensor& t : l) out.push_back(in(t));
      return out;
    }
    if (v.isList()) {
      c10::impl::GenericList l = v.toList();
      c10::impl::GenericList out(l.elementType());
      out.reserve(l.size());
      for (const c10::IValue& e : l) out.push_back(in(e));
      return out;
    }
    if (v.isDevice() && v.toDevice().is_privateuseone()) {
      if (device < 0) device = v.toDevice().index() < 0 ? current_device() : v.toDevice().index();
      return c10::Device(at::kCPU);
    }
    return v;
  }

  at::Tensor out(const at::Tensor& r) {
    if (!r.defined() || r.is_privateuseone()) return r;
    for (auto& p : tensors)
      if (p.second.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return p.first;
    for (auto& t : cpu_inputs)
      if (t.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return r;
    TORCH_CHECK(r.layout() == at::kStrided && !r.is_quantized(), "neuron: this operator returns a ", r.layout(),
                r.is_quantized() ? " quantized" : "", " tensor; neuron tensors support only the strided layout "
                "and non-quantized dtypes");
    at::Tensor v = aliases.neuron_view(r);
    if (v.defined()) return v;
    // A new CPU result: the one copy this fallback makes.
    at::Tensor n = r.is_non_overlapping_and_dense()
                       ? at::empty_strided(r.sizes(), r.strides(), r.options().device(at::kPrivateUse1, device))
                       : at::empty(r.sizes(), r.options().device(at::kPrivateUse1, device));
    AliasSet set;
    set.cpu(n).copy_(r);
    return n;
  }

  c10::IValue out(const c10::IValue& v) {
    if (v.isTensor()) return out(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> l = v.toTensorList();
      c10::List<at::Tensor> res;
      res.reserve(l.size());
      for (const at::Tensor& t : l) res.push_back(out(t));
      return res;
    }
    if (v.isList()) {
      c10::impl::GenericList l = v.toList();
      c10::impl::GenericList res(l.elementType());
      for (const c10::IValue& e : l) res.push_back(out(e));
      return res;
    }
    return v;
  }

  // Metadata a CPU kernel changed on an argument (an out= resize, an in-place restride) is applied to
  // the neuron tensor the caller holds.
  void sync_metadata() {
    for (auto& p : tensors) {
      const at::Tensor& n = p.first;
      const at::Tensor& a = p.second;
      if (n.sizes() == a.sizes() && n.strides() == a.strides() && n.storage_offset() == a.storage_offset()) continue;
      n.unsafeGetTensorImpl()->set_sizes_and_strides(a.sizes(), a.strides(), a.storage_offset());
    }
  }
};

// Operators whose CUDA kernels take CPU tensors beside device tensors: cross-device copies and indices.
bool takes_cpu_tensors(const c10::FunctionSchema& schema) {
  static const std::unordered_set<std::string> names = {
      "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::_to_copy", "aten::to",
      "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_", "aten::_unsafe_index",
      "aten::_unsafe_index_put", "aten::set_", "aten::_foreach_copy_", "aten::_has_same_storage_numel",
      "aten::_pin_memory", "aten::is_pinned", "aten::_local_scalar_dense", "aten::_make_per_tensor_quantized_tensor",
      "aten::_nested_tensor_from_mask", "aten::lift_fresh", "aten::to_padded_tensor", "aten::_cdist_forward"};
  return names.count(schema.name()) != 0;
}

// A CPU tensor beside a neuron tensor is an error, as on CUDA ("Expected all tensors to be on the same
// device"), but for 0-dim CPU tensors (scalars, allowed by TensorIterator ops) and the operators above:
// the fallback could run either on the CPU, so without this check it computed what CUDA refuses.
void check_same_device(const c10::FunctionSchema& schema, const FallbackCall& call) {
  if (call.tensors.empty() || call.cpu_inputs.empty()) return;
  for (const at::Tensor& t : call.cpu_inputs) {
    if (t.dim() == 0 || !t.is_cpu()) continue;
    if (takes_cpu_tensors(schema)) return;
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                call.tensors.front().first.device(), " and cpu! (in ", schema.name(), ")");
  }
}

void neuron_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  auto op_name = [&] {
    std::string name = schema.name();
    if (!schema.overload_name().empty()) name += "." + schema.overload_name();
    return name;
  };
  {
    thread_local const void* last_key = nullptr;  // most ops repeat: skip even the map lookup
    thread_local OpCount* last_slot = nullptr;
    if (last_key != &schema) {
      std::string name = op_name();
      last_slot = &fallback_slot(op, &name);
      last_key = &schema;
    }
    last_slot->fallback.fetch_add(1, std::memory_order_relaxed);
  }
  TORCH_CHECK(!fallback_forbidden(), "neuron: operator ", op_name(), " has no native neuron kernel and "
              "TORCH_NEURONX_DISABLE_FALLBACK is set, which forbids running it on the CPU");

  const auto& args = schema.arguments();
  const size_t n = args.size();
  const size_t base = stack->size() - n;
  FallbackCall call;
  for (size_t i = 0; i < n; ++i) (*stack)[base + i] = call.in((*stack)[base + i]);
  check_same_device(schema, call);
  if (call.device < 0) call.device = current_device();
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (!is_optional_generator(args[i])) continue;
    if (v.isNone() || (v.isGenerator() && v.toGenerator().device().is_privateuseone())) {
      std::optional<at::Generator> g;
      if (v.isGenerator()) g = v.toGenerator();
      v = cpu_generator_from(get_generator(g, call.device));
    }
  }

  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, call.device));
  ProfKernel prof(schema.name().c_str(), ProfKernel::kFallback);
  nrn_stream_id stream = NRN_STREAM_DEFAULT;
  NRN_CHECK(nrn_stream_get_current(call.device, &stream));
  NRN_CHECK(nrn_stream_submit(call.device, stream));
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  call.aliases.adopt_resized();
  call.sync_metadata();
  const size_t nret = schema.returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) (*stack)[i] = call.out((*stack)[i]);
}

}  // namespace

// Convolution picks its implementation by device type and sends devices it does not know to
// convolution_overrideable (and its backward); neuron runs PyTorch's CPU convolution on the aliases.
at::Tensor neuron_convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                           const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                           at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                                           at::IntArrayRef output_padding, int64_t groups) {
  count_cpu_run("aten::convolution_overrideable");
  FallbackCall call;
  at::Tensor in = call.in(input), w = call.in(weight);
  std::optional<at::Tensor> b;
  if (bias.has_value() && bias->defined()) b = call.in(*bias);
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, call.device));
  at::Tensor r;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    r = at::convolution(in, w, b, stride, padding, dilation, transposed, output_padding, groups);
  }
  return call.out(r);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> neuron_convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  count_cpu_run("aten::convolution_backward_overrideable");
  FallbackCall call;
  at::Tensor go = call.in(grad_output), in = call.in(input), w = call.in(weight);
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, call.device));
  int64_t bias_size = grad_output.dim() > 1 ? grad_output.size(1) : 0;
  at::OptionalIntArrayRef bias_sizes;
  if (output_mask[2]) bias_sizes = at::IntArrayRef(&bias_size, 1);
  std::tuple<at::Tensor, at::Tensor, at::Tensor> r;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    r = at::convolution_backward(go, in, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                                 groups, output_mask);
  }
  return {call.out(std::get<0>(r)), call.out(std::get<1>(r)), call.out(std::get<2>(r))};
}

// An operator with both a CPU kernel and a CompositeExplicitAutograd kernel would run the composite one
// on neuron (the dispatcher prefers it to a backend fallback): a decomposition whose intermediate
// roundings differ from CPU (e.g. native_layer_norm, addr in bfloat16). Such operators get the CPU
// kernel through the fallback instead, unless a native neuron kernel is registered. Runs once, after
// every static registration of the extension.
// Registrations made here yield to native kernels registered statically by the families' files.
void route_composite_ops_to_cpu() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                          __FILE__, __LINE__);
    auto& d = c10::Dispatcher::singleton();
    auto has_neuron_kernel = [&](const char* name) {
      auto op = d.findOp(c10::OperatorName(std::string("aten::") + name, ""));
      return op && op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
    };
    if (!has_neuron_kernel("convolution_overrideable"))
      lib->impl("convolution_overrideable", TORCH_FN(neuron_convolution_overrideable));
    if (!has_neuron_kernel("convolution_backward_overrideable"))
      lib->impl("convolution_backward_overrideable", TORCH_FN(neuron_convolution_backward_overrideable));
    // An operator with a native kernel for any overload keeps its composites: they reach that kernel.
    std::unordered_set<std::string> native_ops;
    for (const c10::OperatorName& name : d.getAllOpNames()) {
      auto op = d.findOp(name);
      if (op && op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) native_ops.insert(name.name);
    }
    for (const c10::OperatorName& name : d.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0 || native_ops.count(name.name)) continue;
      auto op = d.findOp(name);
      // Also run on the CPU kernel, though the composite would otherwise take them:
      // - structured ops whose CPU meta function resizes an allocated output to the elementwise shape and
      //   back (mse_loss, smooth_l1_loss with a reduction): through their .out overload with the 0-dim output
      //   the composite allocated, CPU warned that it was resized on every call;
      // - mode.values, a composite that refuses devices other than CPU, CUDA and XPU.
      static const std::unordered_set<std::string> forced = {"aten::mse_loss", "aten::smooth_l1_loss",
                                                             "aten::mode.values"};
      const std::string qualified = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
      const bool force = forced.count(qualified) > 0;
      if (!op || !(force || (op->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
                             op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd))))
        continue;
      std::string full = name.name.substr(6);
      if (!name.overload_name.empty()) full += "." + name.overload_name;
      lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
    }
  });
}

}  // namespace torch_neuronx

using namespace torch_neuronx;

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", neuron_empty);
  m.impl("empty_strided", neuron_empty_strided);
  m.impl("as_strided", neuron_as_strided);
  m.impl("view", neuron_view);
  m.impl("_reshape_alias", neuron_reshape_alias);
  m.impl("resize_", neuron_resize_);
  m.impl("set_.source_Storage_storage_offset", neuron_set_storage);
  m.impl("set_.source_Storage", neuron_set_source_storage);
  m.impl("set_.source_Tensor", neuron_set_source_tensor);
  m.impl("set_", neuron_set_empty);
  m.impl("_copy_from", neuron_copy_from);
  m.impl("_copy_from_and_resize", neuron_copy_from_and_resize);
  m.impl("_local_scalar_dense", neuron_local_scalar_dense);
  m.impl("fill_.Scalar", neuron_fill_scalar);
  m.impl("fill_.Tensor", neuron_fill_tensor);
  m.impl("zero_", neuron_zero_);
  m.impl("uniform_", neuron_uniform_);
  m.impl("normal_", neuron_normal_);
  m.impl("random_", neuron_random_);
  m.impl("random_.from", neuron_random_from);
  m.impl("random_.to", neuron_random_to);
  m.impl("bernoulli_.float", neuron_bernoulli_float);
  m.impl("bernoulli_.Tensor", neuron_bernoulli_tensor);
  m.impl("bernoulli", neuron_bernoulli);
  m.impl("randperm.generator_out", neuron_randperm_out);
  m.impl("exponential_", neuron_exponential_);
  m.impl("multinomial", neuron_multinomial);
  m.impl("native_dropout", neuron_native_dropout);
  m.impl("record_stream", neuron_record_stream);
  m.impl("_has_compatible_shallow_copy_type", neuron_has_compatible_shallow_copy_type);
}

// PyTorch's copy_ hands copies that involve a neuron tensor to _copy_from. Its conjugate and negative
// view fallbacks would materialise a conj/neg source with clone, itself a copy_, hence _copy_from again,
// without end; the neuron copy handles both bits itself (on CPU aliases that keep them).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
}

// Autocast: the same op lists and policies as CUDA.
#define NEURON_AUTOCAST_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_AUTOCAST_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

namespace at::autocast {  // the op lists name ATen types unqualified
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NEURON_AUTOCAST_LOWER)
  AT_FORALL_FP32(NEURON_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_AUTOCAST_FP32_OPT)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NEURON_AUTOCAST_PROMOTE)
}
}  // namespace at::autocast
