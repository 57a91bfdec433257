// The neuron device for PyTorch: allocators, device guard, hooks and generator over the C runtime.
#include "aten/neuron_aten.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/CallOnce.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <random>

namespace torch_neuronx {

void raise_status(nrn_status s, const char* what) {
  std::string msg = nrn_last_error();
  if (msg.empty()) msg = std::string(what) + " failed: " + nrn_status_str(s);
  if (s == NRN_RESOURCE) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron out of memory: ", msg,
                     ". torch.neuron.memory_summary() shows what the allocator holds; "
                     "torch.neuron.memory._record_memory_history() before the failing code and "
                     "torch.neuron.memory._snapshot() after it show which code allocated it");
  }
  TORCH_CHECK(false, "neuron runtime error (", nrn_status_str(s), "): ", msg);
}

void ensure_init() {
  if (nrn_is_initialized()) return;
  NRN_CHECK(nrn_init());
}

int device_count() {
  ensure_init();
  int n = 0;
  NRN_CHECK(nrn_device_count(&n));
  return n;
}

void check_device_index(int64_t index) {
  int n = device_count();
  TORCH_CHECK_INDEX(index >= 0 && index < n, "Invalid device neuron:", index, ": this process sees ", n,
                    " NeuronCore", n == 1 ? "" : "s", " (neuron:0 to neuron:", n - 1,
                    "); NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES select them");
}

c10::DeviceIndex current_device() {
  ensure_init();
  int d = 0;
  NRN_CHECK(nrn_device_get_current(&d));
  return static_cast<c10::DeviceIndex>(d);
}

// ---- device allocator ---------------------------------------------------------------------------

namespace {

void neuron_free(void* ptr) {
  if (memory_history_recording()) memory_history_free(ptr);
  nrn_status s = nrn_mem_free(ptr);
  // A deleter must not throw; a failure here means a pointer the runtime does not know, which is a bug.
  if (s != NRN_SUCCESS) nrn_log(NRN_LOG_ERROR, "freeing %p: %s", ptr, nrn_last_error());
}

void copy_stat(c10::CachingAllocator::Stat& dst, const nrn_stat& src) {
  dst.current = src.current;
  dst.peak = src.peak;
  dst.allocated = src.allocated;
  dst.freed = src.freed;
}

void copy_stats(c10::CachingAllocator::StatArray& dst, const nrn_stat* src) {
  for (size_t i = 0; i < NRN_POOL_COUNT; ++i) copy_stat(dst[i], src[i]);
}

struct NeuronAllocator final : public c10::DeviceAllocator {
  at::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex dev = current_device();
    void* p = nullptr;
    if (nbytes > 0 && memory_history_recording()) {
      nrn_mem_stats before, after;
      NRN_CHECK(nrn_mem_get_stats(dev, &before));
      nrn_status s = nrn_mem_alloc(dev, nbytes, &p);
      if (s == NRN_RESOURCE) memory_history_oom(dev, nbytes);
      if (s != NRN_SUCCESS) raise_status(s, "nrn_mem_alloc");
      NRN_CHECK(nrn_mem_get_stats(dev, &after));
      memory_history_alloc(dev, p, nbytes, after.num_device_alloc > before.num_device_alloc);
    } else if (nbytes > 0) {
      NRN_CHECK(nrn_mem_alloc(dev, nbytes, &p));
    }
    return {p, p, &neuron_free, c10::Device(c10::DeviceType::PrivateUse1, dev)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &neuron_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }
  bool initialized() override { return nrn_is_initialized(); }
  void emptyCache(c10::MempoolId_t) override {
    ensure_init();
    NRN_CHECK(nrn_mem_empty_cache(-1));
  }
  // Execution is synchronous, so a block is free for reuse as soon as it is freed (see the runtime's
  // execution model); there is nothing to record yet.
  void recordStream(const at::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device_index(device);
    nrn_mem_stats s;
    NRN_CHECK(nrn_mem_get_stats(device, &s));
    c10::CachingDeviceAllocator::DeviceStats out;
    copy_stats(out.allocation, s.allocation);
    copy_stats(out.segment, s.segment);
    copy_stats(out.active, s.active);
    copy_stats(out.inactive_split, s.inactive_split);
    copy_stats(out.allocated_bytes, s.allocated_bytes);
    copy_stats(out.reserved_bytes, s.reserved_bytes);
    copy_stats(out.active_bytes, s.active_bytes);
    copy_stats(out.inactive_split_bytes, s.inactive_split_bytes);
    copy_stats(out.requested_bytes, s.requested_bytes);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_sync_all_streams = s.num_sync_all_streams;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    copy_stat(out.oversize_allocations, s.oversize_allocations);
    copy_stat(out.oversize_segments, s.oversize_segments);
    out.max_split_size = s.max_split_size;
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device_index(device);
    NRN_CHECK(nrn_mem_reset_accumulated_stats(device));
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    check_device_index(device);
    NRN_CHECK(nrn_mem_reset_peak_stats(device));
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device_index(device);
    uint64_t free_b = 0, total_b = 0;
    NRN_CHECK(nrn_mem_get_info(device, &free_b, &total_b));
    return {static_cast<size_t>(free_b), static_cast<size_t>(total_b)};
  }
};

NeuronAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

// ---- pinned host allocator ----------------------------------------------------------------------

void host_free(void* ptr) {
  if (nrn_host_free(ptr) != NRN_SUCCESS) nrn_log(NRN_LOG_ERROR, "freeing pinned %p: %s", ptr, nrn_last_error());
}

struct NeuronHostAllocator final : public at::HostAllocator {
  at::DataPtr allocate(size_t nbytes) override {
    ensure_init();
    void* p = nullptr;
    if (nbytes > 0) NRN_CHECK(nrn_host_alloc(nbytes, &p));
    return {p, p, &host_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &host_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }
  // Pinned buffers are not cached, so no buffer is reused while a stream may still read it.
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

NeuronHostAllocator g_host_allocator;
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator)

}  // namespace

c10::DeviceAllocator* neuron_allocator() { return &g_allocator; }

// ---- device guard -------------------------------------------------------------------------------

namespace {

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = c10::DeviceType::PrivateUse1;
  NeuronGuardImpl() = default;
  explicit NeuronGuardImpl(c10::DeviceType t) {
    TORCH_CHECK(t == static_type, "NeuronGuardImpl for ", t);
  }
  c10::DeviceType type() const override { return static_type; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(static_type, current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == static_type, "expected a neuron device, got ", d);
    check_device_index(d.index());
    NRN_CHECK(nrn_device_set_current(d.index()));
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { (void)nrn_device_set_current(d.index()); }

  c10::Stream make_stream(c10::DeviceIndex dev, nrn_stream_id id) const {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(static_type, dev), static_cast<c10::StreamId>(id));
  }
  c10::Stream getStream(c10::Device d) const override {
    nrn_stream_id s = NRN_STREAM_DEFAULT;
    (void)nrn_stream_get_current(d.index(), &s);
    return make_stream(d.index(), s);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return make_stream(d.index(), NRN_STREAM_DEFAULT); }
  c10::Stream getNewStream(c10::Device d, int priority = 0) const override {
    c10::DeviceIndex dev = d.index() < 0 ? current_device() : d.index();
    check_device_index(dev);
    nrn_stream_id s;
    NRN_CHECK(nrn_stream_create(dev, priority, &s));
    return make_stream(dev, s);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool isHighPriority = false) const override {
    return getNewStream(d, isHighPriority ? NRN_STREAM_PRIORITY_HIGH : NRN_STREAM_PRIORITY_LOW);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    c10::Stream old = getStream(s.device());
    (void)nrn_stream_set_current(s.device_index(), s.id());
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    int n = 0;
    if (nrn_init() != NRN_SUCCESS || nrn_device_count(&n) != NRN_SUCCESS) return 0;
    return static_cast<c10::DeviceIndex>(n);
  }
  bool queryStream(const c10::Stream& s) const override {
    bool done = false;
    NRN_CHECK(nrn_stream_query(s.device_index(), s.id(), &done));
    return done;
  }
  void synchronizeStream(const c10::Stream& s) const override {
    NRN_CHECK(nrn_stream_synchronize(s.device_index(), s.id()));
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    NRN_CHECK(nrn_device_synchronize(device_index));
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ", device_index,
                " does not match recording stream's device index ", stream.device_index(), ".");
    auto* ev = static_cast<nrn_event*>(*event);
    if (!ev) {
      unsigned flags = flag == c10::EventFlag::BACKEND_DEFAULT ? NRN_EVENT_TIMING : NRN_EVENT_DEFAULT;
      NRN_CHECK(nrn_event_create(flags, &ev));
      *event = ev;
    }
    NRN_CHECK(nrn_event_record(ev, stream.device_index(), stream.id()));
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (!event) return;
    NRN_CHECK(nrn_stream_wait_event(stream.device_index(), stream.id(), static_cast<nrn_event*>(event)));
  }
  bool queryEvent(void* event) const override {
    if (!event) return true;
    bool done = false;
    NRN_CHECK(nrn_event_query(static_cast<nrn_event*>(event), &done));
    return done;
  }
  void synchronizeEvent(void* event) const override {
    if (!event) return;
    NRN_CHECK(nrn_event_synchronize(static_cast<nrn_event*>(event)));
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    (void)nrn_event_destroy(static_cast<nrn_event*>(event));
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    double ms = 0;
    NRN_CHECK(nrn_event_elapsed_ms(static_cast<nrn_event*>(start), static_cast<nrn_event*>(end), &ms));
    return ms;
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    g_allocator.recordStream(data_ptr, stream);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace

// ---- generator ----------------------------------------------------------------------------------

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex device_index)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device_index),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(c10::default_rng_seed_val) {}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

void NeuronGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(offset % 4 == 0, "neuron generator offset must be a multiple of 4, got ", offset);
  offset_ = offset;
}

uint64_t NeuronGeneratorImpl::get_offset() const { return offset_; }
uint64_t NeuronGeneratorImpl::current_seed() const { return seed_; }

uint64_t NeuronGeneratorImpl::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom(true);
  set_current_seed(s);
  return s;
}

// State layout: 8 bytes seed then 8 bytes offset (little-endian uint64), as DTensor's tracker reads it.
void NeuronGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && new_state.numel() == 16,
              "neuron generator state must be a torch.uint8 tensor of 16 bytes (seed, offset), got ",
              new_state.dtype(), " with ", new_state.numel(), " elements");
  TORCH_CHECK(new_state.device().is_cpu(), "neuron generator state must be a CPU tensor");
  uint64_t v[2];
  std::memcpy(v, new_state.data(), 16);
  TORCH_CHECK(v[1] % 4 == 0, "neuron generator offset must be a multiple of 4, got ", v[1]);
  seed_ = v[0];
  offset_ = v[1];
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
  uint64_t v[2] = {seed_, offset_};
  std::memcpy(t.data_ptr(), v, 16);
  return t.getIntrusivePtr();
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  auto* g = new NeuronGeneratorImpl(device().index());
  g->seed_ = seed_;
  g->offset_ = offset_;
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex device_index) {
  static std::mutex mu;
  static std::deque<at::Generator> gens;  // deque: references stay valid as it grows
  if (device_index < 0) device_index = current_device();
  check_device_index(device_index);
  std::lock_guard<std::mutex> lock(mu);
  while (static_cast<int64_t>(gens.size()) <= device_index)
    gens.push_back(at::make_generator<NeuronGeneratorImpl>(static_cast<c10::DeviceIndex>(gens.size())));
  return gens[device_index];
}

NeuronGeneratorImpl* get_generator(const std::optional<at::Generator>& gen, c10::DeviceIndex device_index) {
  const at::Generator& g = (gen.has_value() && gen->defined()) ? *gen : default_generator(device_index);
  TORCH_CHECK(g.device().type() == c10::DeviceType::PrivateUse1, "Expected a 'neuron' device type for generator but found '",
              g.device().type(), "'");
  return at::check_generator<NeuronGeneratorImpl>(g);
}

// ---- hooks --------------------------------------------------------------------------------------

namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override {
    int n = 0;
    return nrn_init() == NRN_SUCCESS && nrn_device_count(&n) == NRN_SUCCESS && n > 0;
  }
  void init() const override { ensure_init(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return nrn_is_initialized(); }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_device_index(device);
    NRN_CHECK(nrn_device_set_current(device));
  }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex old = current_device();
    if (device != old) setCurrentDevice(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    if (device_index < 0) device_index = current_device();
    check_device_index(device_index);
    return at::make_generator<NeuronGeneratorImpl>(device_index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    int dev = -1;
    TORCH_CHECK(nrn_mem_device_of(data, &dev) == NRN_SUCCESS, "pointer ", data, " is not neuron device memory");
    return at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(dev));
  }
  bool isPinnedPtr(const void* data) const override { return nrn_host_is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_host_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::DeviceGuard guard(storage.device());
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(new NeuronHooks()); }
} g_register_hooks;

}  // namespace
}  // namespace torch_neuronx
