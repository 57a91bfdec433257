// torch.profiler support: device kernels of the neuron device as Kineto activities.
//
// PyTorch 2.13 lets a PrivateUse1 backend register a Kineto activity profiler
// (REGISTER_PRIVATEUSE1_PROFILER). While a session with ProfilerActivity.PrivateUse1 records:
//   - g_prof_active is set, so each native kernel (NEURON_NATIVE), fallback op and collective opens a
//     ProfKernel range: its span on the calling thread, where this device executes synchronously;
//   - Kineto hands the session the correlation id of each operator PyTorch records (pushCorrelationId),
//     so a range is linked to the operator it runs in: PyTorch adds its duration to that operator's
//     device time (the NEURON columns of key_averages()) and draws the kernel on the device's row;
//   - a RecordFunction callback notes the shapes, dtypes and bytes of the tensors of each operator that
//     takes neuron tensors, which the ranges opened inside it carry as metadata.
// With no session nothing is registered and an op pays one relaxed load per kernel.
// fmt in header-only mode: the torch wheel does not export fmt::vformat (used by GenericTraceActivity::addMetadata).
#define FMT_HEADER_ONLY 1
#ifndef USE_KINETO
#define USE_KINETO 1
#endif
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <libkineto.h>
#include <output_base.h>

#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ApproximateClock.h>
#include <torch/extension.h>

#include <deque>
#include <mutex>
#include <set>
#include <sstream>

#include "aten/neuron_aten.h"

namespace torch_neuronx {

std::atomic<bool> g_prof_active{false};

namespace {

constexpr int kNative = ProfKernel::kNative, kFallback = ProfKernel::kFallback,
              kCollective = ProfKernel::kCollective, kGraph = ProfKernel::kGraph,
              kGenerated = ProfKernel::kGenerated;

struct Rec {
  std::string name;
  int kind = kNative;
  int64_t start = 0, end = 0;
  uint64_t corr = 0;
  int32_t tid = 0;
  int device = 0;
  std::string dims, types;  // JSON lists, as PyTorch writes "Input Dims" / "Input type"
  int64_t bytes = -1;       // bytes of the operator's tensors (inputs, and outputs it returned)
  int64_t read = -1, written = -1;  // a collective's traffic (bytes = read + written)
  // Set by the caller (a generated kernel knows its tensors; a compiled graph its device; a collective its
  // traffic): the operator the range runs in must not replace them.
  bool own_shapes = false, own_device = false, own_bytes = false;
};

// The operator (RecordFunction) a range runs in: what it knows of its tensors.
struct Frame : at::ObserverContext {
  bool neuron = false;
  int device = -1;
  std::string dims, types;
  int64_t in_bytes = 0;
  std::vector<int64_t> recs;
};

std::mutex g_mu;
std::deque<Rec> g_recs;                      // this session's ranges
at::CallbackHandle g_cb = 0;

thread_local std::vector<uint64_t> t_corr;   // Kineto's correlation ids of this thread's open operators
thread_local std::vector<uint64_t> t_user;   // ... and of its open record_function ranges
thread_local std::vector<Frame*> t_frames;   // this thread's open operators taking neuron tensors

int32_t thread_id() { return static_cast<int32_t>(at::RecordFunction::currentThreadId()); }

void add_value(const c10::IValue& v, Frame& f, std::ostringstream& dims, std::ostringstream& types, bool& first,
               int64_t& bytes) {
  if (!first) {
    dims << ", ";
    types << ", ";
  }
  first = false;
  auto tensor = [&](const at::Tensor& t) {
    dims << "[";
    for (int64_t i = 0; i < t.dim(); ++i) dims << (i ? ", " : "") << t.sizes()[i];
    dims << "]";
    types << "\"" << c10::toString(t.scalar_type()) << "\"";
    if (t.device().is_privateuseone()) {
      if (!f.neuron) f.device = t.device().index();
      f.neuron = true;
    }
    bytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
  };
  if (v.isTensor() && v.toTensor().defined()) {
    tensor(v.toTensor());
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    dims << "[";
    types << "\"TensorList\"";
    for (size_t i = 0; i < list.size(); ++i) {
      at::Tensor t = list.get(i);
      if (!t.defined()) continue;
      dims << (i ? ", " : "") << "[";
      for (int64_t d = 0; d < t.dim(); ++d) dims << (d ? ", " : "") << t.sizes()[d];
      dims << "]";
      if (t.device().is_privateuseone()) {
        if (!f.neuron) f.device = t.device().index();
        f.neuron = true;
      }
      bytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
    }
    dims << "]";
  } else {
    dims << "[]";
    types << "\"" << (v.isScalar() ? "Scalar" : v.tagKind()) << "\"";
  }
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  auto f = std::make_unique<Frame>();
  std::ostringstream dims, types;
  bool first = true;
  int64_t bytes = 0;
  for (const auto& v : fn.inputs()) add_value(v, *f, dims, types, first, bytes);
  // Every operator gets a frame (also those without neuron inputs, e.g. an allocation), so a range
  // always takes the shapes of the operator it runs in.
  f->dims = "[" + dims.str() + "]";
  f->types = "[" + types.str() + "]";
  f->in_bytes = bytes;
  t_frames.push_back(f.get());
  return f;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (!ctx) return;
  auto* f = static_cast<Frame*>(ctx);
  if (!t_frames.empty() && t_frames.back() == f) t_frames.pop_back();
  if (f->recs.empty()) return;
  int64_t out_bytes = 0;
  int device = f->device;
  for (const auto& v : fn.outputs()) {
    if (v.isTensor() && v.toTensor().defined()) {
      const at::Tensor& t = v.toTensor();
      out_bytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
      // An operator without neuron inputs (a factory, a copy to the device) ran where its result is.
      if (device < 0 && t.device().is_privateuseone()) device = t.device().index();
    }
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (int64_t i : f->recs) {
    if (i >= static_cast<int64_t>(g_recs.size())) continue;
    Rec& r = g_recs[i];
    if (!r.own_shapes) {
      r.dims = f->dims;
      r.types = f->types;
    }
    if (!r.own_bytes) r.bytes = f->in_bytes + out_bytes;
    if (device >= 0 && !r.own_device) r.device = device;
  }
}

const char* kind_prefix(int kind) {
  switch (kind) {
    case kFallback: return "[neuron fallback] ";
    case kCollective: return "[neuron collective] ";
    case kGraph: return "[neuron graph] ";
    default: return "[neuron] ";  // native and generated kernels
  }
}
const char* kind_name(int kind) {
  switch (kind) {
    case kFallback: return "fallback";
    case kCollective: return "collective";
    case kGraph: return "compiled graph";
    case kGenerated: return "generated";
    default: return "native";
  }
}

// Kernels open inside a kernel on this thread (a native op built on other native ops, the allocation of
// its output): they are part of the outer kernel's time and are not recorded, so device times add up.
// A compiled graph's range does not count: the kernels it runs are its content.
thread_local int t_in_kernel = 0;

// `proto`: what the caller already knows of the range (shapes, bytes).
int64_t open_range(const std::string& name, int kind, int device = -1, Rec* proto = nullptr) {
  if (kind != kGraph && t_in_kernel++ > 0) return -1;
  Rec r = proto ? std::move(*proto) : Rec();
  r.name = kind_prefix(kind) + name;
  r.kind = kind;
  // Ranges opened from Python (a compiled graph, a generated kernel) belong to the record_function range
  // the caller opens around them; a native kernel to its operator.
  const auto& ids = kind == kGraph || kind == kGenerated ? t_user : t_corr;
  r.corr = ids.empty() ? 0 : ids.back();
  r.tid = thread_id();
  Frame* f = t_frames.empty() ? nullptr : t_frames.back();
  r.own_device = device >= 0;
  r.device = device >= 0                  ? device
             : f && f->device >= 0       ? f->device
                                         : c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index();
  std::lock_guard<std::mutex> lock(g_mu);
  int64_t i = static_cast<int64_t>(g_recs.size());
  g_recs.push_back(std::move(r));
  if (f) f->recs.push_back(i);
  g_recs.back().start = c10::getTime();
  return i;
}

void close_range(int64_t i) {
  int64_t t = c10::getTime();
  std::lock_guard<std::mutex> lock(g_mu);
  if (i < static_cast<int64_t>(g_recs.size())) g_recs[i].end = t;
}

class Session : public libkineto::IActivityProfilerSession {
 public:
  // Kineto configures every registered profiler; ours records only when device activities were asked
  // for (ProfilerActivity.PrivateUse1), so a CPU-only profile stays as it was.
  explicit Session(bool enabled) : enabled_(enabled) {}
  void start() override {
    if (!enabled_) return;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_recs.clear();
    }
    if (g_cb == 0) {
      g_cb = at::addGlobalCallback(
          at::RecordFunctionCallback(on_enter, on_exit).needsInputs(true).needsOutputs(true));
    }
    g_prof_active.store(true, std::memory_order_relaxed);
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    if (!enabled_) return;
    g_prof_active.store(false, std::memory_order_relaxed);
    if (g_cb != 0) {
      at::removeCallback(g_cb);
      g_cb = 0;
    }
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return {}; }
  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t start_time, int64_t) override {
    if (!enabled_) return;
    std::deque<Rec> recs;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      recs.swap(g_recs);
    }
    std::set<int> devices;
    for (const Rec& r : recs) {
      if (r.end <= r.start) continue;
      auto a = std::make_unique<libkineto::GenericTraceActivity>(span_, libkineto::ActivityType::CONCURRENT_KERNEL,
                                                                 r.name);
      a->startTime = r.start;
      a->endTime = r.end;
      a->id = static_cast<int32_t>(r.corr);
      a->device = r.device;
      a->resource = r.tid;
      a->threadId = r.tid;
      a->linked = r.corr ? linked(static_cast<int32_t>(r.corr)) : nullptr;
      a->addMetadataQuoted("kind", kind_name(r.kind));
      a->addMetadata("device", r.device);
      if (r.corr) a->addMetadata("correlation", r.corr);
      if (!r.dims.empty() && r.kind != kGraph) {
        a->addMetadata("Input Dims", r.dims);
        a->addMetadata("Input type", r.types);
      }
      if (r.bytes >= 0 && r.kind != kGraph) a->addMetadata("bytes", r.bytes);
      if (r.read >= 0) {
        a->addMetadata("bytes read", r.read);
        a->addMetadata("bytes written", r.written);
      }
      logger.handleGenericActivity(*a);
      acts_.push_back(std::move(a));
      devices.insert(r.device);
    }
    // A device row per core the kernels ran on (the trace's pid is the device index); getDeviceInfo can
    // describe one, so neuron:0 comes from there and the others from here.
    for (int d : devices) {
      if (d != 0) logger.handleDeviceInfo(device_info(d), start_time);
    }
    // One trace per session: Kineto may start a session it already processed again for a later
    // profile that did not ask for device activities.
    enabled_ = false;
  }
  static libkineto::DeviceInfo device_info(int d) {
    std::string name = "neuron:" + std::to_string(d);
    return libkineto::DeviceInfo{d, d, name, name};
  }
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(device_info(0));
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }
  void pushCorrelationId(uint64_t id) override {
    if (enabled_) t_corr.push_back(id);
  }
  void popCorrelationId() override {
    if (enabled_ && !t_corr.empty()) t_corr.pop_back();
  }
  void pushUserCorrelationId(uint64_t id) override {
    if (enabled_) t_user.push_back(id);
  }
  void popUserCorrelationId() override {
    if (enabled_ && !t_user.empty()) t_user.pop_back();
  }

 private:
  bool enabled_;
  libkineto::TraceSpan span_{0, 0, "neuron"};
  std::vector<std::unique_ptr<libkineto::GenericTraceActivity>> acts_;
};

class NeuronActivityProfiler : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return acts_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config&) override {
    // The device types (kernels) are asked for only with ProfilerActivity.PrivateUse1; the PrivateUse1
    // runtime types are in every set.
    bool device = types.count(libkineto::ActivityType::CONCURRENT_KERNEL) > 0;
    return std::make_unique<Session>(device);
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& c) override {
    return configure(types, c);
  }

 private:
  std::string name_{"neuron"};
  std::set<libkineto::ActivityType> acts_{libkineto::ActivityType::CONCURRENT_KERNEL,
                                          libkineto::ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

}  // namespace

void ProfKernel::begin(const char* name, Kind kind) {
  rec_ = open_range(name, kind);
  if (rec_ < 0 && kind != kGraph) rec_ = kNested;
}

void ProfKernel::end() {
  if (rec_ != kNested) close_range(rec_);
  if (t_in_kernel > 0) t_in_kernel--;
}

void ProfKernel::set_bytes(int64_t read, int64_t written) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (rec_ >= static_cast<int64_t>(g_recs.size())) return;  // the session ended meanwhile
  Rec& r = g_recs[rec_];
  r.read = read;
  r.written = written;
  r.bytes = read + written;
  r.own_bytes = true;
}

int64_t prof_range_begin(const std::string& name, int device) {
  if (!g_prof_active.load(std::memory_order_relaxed)) return -1;
  return open_range(name, kGraph, device);
}

int64_t prof_kernel_begin(const std::string& name, const std::vector<at::Tensor>& args) {
  if (!g_prof_active.load(std::memory_order_relaxed)) return -1;
  // Described as an operator with these arguments would be (the wrapper calls the kernel with no
  // operator around it), before the range starts so its time is the kernel's.
  Frame f;
  std::ostringstream dims, types;
  bool first = true;
  Rec r;
  r.bytes = 0;
  for (const auto& t : args) add_value(c10::IValue(t), f, dims, types, first, r.bytes);
  r.dims = "[" + dims.str() + "]";
  r.types = "[" + types.str() + "]";
  r.own_shapes = r.own_bytes = true;
  int64_t i = open_range(name, kGenerated, f.device, &r);
  return i < 0 ? -2 : i;
}

void prof_range_end(int64_t token, int kind) {
  if (token == -1) return;
  if (token >= 0) close_range(token);
  if (kind != kGraph && t_in_kernel > 0) t_in_kernel--;
}

}  // namespace torch_neuronx
