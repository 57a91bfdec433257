// Shared declarations of the PyTorch binding (csrc/aten). The binding only adapts PyTorch's interfaces to
// the C runtime (runtime/neuron_runtime.h) and kernel library (kernels/neuron_kernels.h).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <string>

extern "C" {
#include "kernels/neuron_kernels.h"
#include "runtime/neuron_runtime.h"
}

namespace torch_neuronx {

// Raises the runtime's last error as a Python exception: torch.OutOfMemoryError for NRN_RESOURCE,
// RuntimeError otherwise. `what` names the failing call.
[[noreturn]] void raise_status(nrn_status s, const char* what);

#define NRN_CHECK(expr)                                   \
  do {                                                    \
    nrn_status _nrn_s = (expr);                           \
    if (_nrn_s != NRN_SUCCESS) ::torch_neuronx::raise_status(_nrn_s, #expr); \
  } while (0)

// Runtime initialisation on first use; raises with the runtime's message (e.g. a bad environment).
void ensure_init();
int device_count();
// Raises a clear error unless 0 <= index < device_count().
void check_device_index(int64_t index);
c10::DeviceIndex current_device();

c10::DeviceAllocator* neuron_allocator();

// Memory history (neuron_memory_history.cpp): while recording, the allocator reports each allocation
// (new_segment: it mapped a segment), free and out-of-memory error with the Python stack that made it.
bool memory_history_recording();
void memory_history_alloc(int device, void* ptr, size_t size, bool new_segment);
void memory_history_free(void* ptr);
void memory_history_oom(int device, size_t size);

// The neuron generator: Philox key (seed) and counter offset, as DTensor's RNG tracker reads them.
struct NeuronGeneratorImpl : public c10::GeneratorImpl {
  explicit NeuronGeneratorImpl(c10::DeviceIndex device_index = -1);
  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }
  // The key and a pointer to the offset; the caller holds mutex_ and lets a kernel advance the offset.
  uint64_t seed_value() const { return seed_; }
  uint64_t* offset_ptr() { return &offset_; }

 private:
  NeuronGeneratorImpl* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

const at::Generator& default_generator(c10::DeviceIndex device_index);
// The generator an op uses: the one passed, else the default generator of the device.
NeuronGeneratorImpl* get_generator(const std::optional<at::Generator>& gen, c10::DeviceIndex device_index);

// Kernel-library descriptor of a tensor (host-addressable memory: neuron or CPU). Returns false when
// the tensor cannot be described (dtype without a kernel, too many dims, conj/neg bits).
bool to_nk(const at::Tensor& t, nk_tensor* out);
// to_nk for tensors a kernel was chosen for: raises naming op, the sizes and the dtype if t cannot be described.
nk_tensor nk_desc(const at::Tensor& t, const char* op);
bool nk_dtype_of(at::ScalarType st, nk_dtype* out);
[[noreturn]] void raise_kernel_status(nk_status s, const char* op, const at::Tensor& t);

// A CPU tensor sharing the memory (and the sizes, strides, offset, conj/neg bits) of a neuron tensor.
// The CPU storage does not own the memory: the neuron tensor must outlive the alias.
at::Tensor cpu_alias(const at::Tensor& t);

// Whether a kernel writing one of a and b may change what it reads from the other (false: provably apart;
// an undefined or empty tensor is apart from anything). at::get_overlap_status answers TooHard for any
// tensor that is not dense, an expanded bias or a strided view included, even in another allocation, which
// sent every addmm with a 1-D bias to the CPU kernel: tensors whose storages' bytes do not intersect are
// apart; otherwise get_overlap_status decides, TooHard counting as overlap. (The reductions and selections
// still treat TooHard as overlap: their kernels' order on some non-dense inputs is not yet CPU's.)
bool may_overlap(const at::Tensor& a, const at::Tensor& b);

// Convolution through PyTorch's CPU kernels on the device memory (what native convolution falls back to).
at::Tensor neuron_convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                           const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                           at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                                           at::IntArrayRef output_padding, int64_t groups);
std::tuple<at::Tensor, at::Tensor, at::Tensor> neuron_convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask);
// Per-operator call counters: native kernel vs CPU fallback.
struct OpCount;
OpCount& count_slot(const std::string& op);
void count_native_slot(OpCount& slot);
// ---- profiler (neuron_profiler.cpp) ----
// True while a torch.profiler session with ProfilerActivity.PrivateUse1 records: the only thing an op reads
// when no profiler is attached (one relaxed load and a not-taken branch per kernel).
extern std::atomic<bool> g_prof_active;
// A device-kernel range for the profiler: the span of a native kernel, a fallback op or a collective on the
// calling thread (the device executes there, synchronously), linked to the operator PyTorch recorded.
class ProfKernel {
 public:
  // kGenerated: a kernel Inductor generated, run by a compiled graph's wrapper.
  enum Kind { kNative = 0, kFallback = 1, kCollective = 2, kGraph = 3, kGenerated = 4 };
  explicit ProfKernel(const char* name, Kind kind = kNative) {
    if (C10_UNLIKELY(g_prof_active.load(std::memory_order_relaxed))) begin(name, kind);
  }
  ~ProfKernel() {
    if (C10_UNLIKELY(rec_ != -1)) end();
  }
  ProfKernel(const ProfKernel&) = delete;
  ProfKernel& operator=(const ProfKernel&) = delete;
  // The bytes the kernel reads and writes, where the operator's tensors do not tell (a collective moves
  // more or less than its arguments hold).
  void bytes(int64_t read, int64_t written) {
    if (C10_UNLIKELY(rec_ >= 0)) set_bytes(read, written);
  }

 private:
  static constexpr int64_t kNested = -2;  // inside another kernel: not recorded, only counted
  void begin(const char* name, Kind kind);
  void end();
  void set_bytes(int64_t read, int64_t written);
  int64_t rec_ = -1;
};
// The same ranges from Python. A compiled graph's, on `device` (-1: the current one); a kernel Inductor
// generated (kGenerated), with the shapes, dtypes, bytes and device of its tensor arguments. Both return a
// token for prof_range_end: -1 when no profiler records, -2 for a kernel inside another kernel.
int64_t prof_range_begin(const std::string& name, int device);
int64_t prof_kernel_begin(const std::string& name, const std::vector<at::Tensor>& args);
void prof_range_end(int64_t token, int kind);

// Counts one native call of `op` (the counter is looked up once per call site) and, while a profiler
// records, times the rest of the enclosing scope as a device kernel of that name.
#define NEURON_NATIVE(op)                                                          \
  static ::torch_neuronx::OpCount& _neuron_slot = ::torch_neuronx::count_slot(op); \
  ::torch_neuronx::count_native_slot(_neuron_slot);                                \
  ::torch_neuronx::ProfKernel _neuron_prof(op)

}  // namespace torch_neuronx
