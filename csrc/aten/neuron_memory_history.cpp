// Memory history and snapshots of the neuron allocator, in the format of torch.cuda.memory._snapshot(), so
// that torch.cuda._memory_viz (and pytorch.org/memory_viz) render them. The runtime lists the blocks of
// its segments (nrn_mem_snapshot); this file records, while enabled, each allocation and free with the
// Python stack that made it (PyTorch's CapturedTraceback, symbolised only when a snapshot is taken).
#include "aten/neuron_aten.h"

#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>

// From torch/csrc/profiler/python/combined_traceback.h, which needs nlohmann/json (not in the wheel's headers).
namespace torch {
std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
void installCapturedTracebackPython();
}  // namespace torch

namespace torch_neuronx {
namespace {

struct TraceEntry {
  const char* action;  // alloc, free_requested, free_completed, segment_alloc, oom
  int device;
  uint64_t addr, size;
  int64_t time_us;
  std::shared_ptr<torch::CapturedTraceback> frames;
};

struct Live {
  int device;
  uint64_t size;
  std::shared_ptr<torch::CapturedTraceback> frames;
};

struct History {
  std::mutex mu;
  size_t max_entries = 0;
  bool stacks = true;
  std::deque<TraceEntry> trace;
  std::unordered_map<uint64_t, Live> live;  // allocations made while recording, by address
};

std::atomic<bool> g_recording{false};

History& history() {
  static History* h = new History();  // never destroyed: deleters may run during interpreter exit
  return *h;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::shared_ptr<torch::CapturedTraceback> gather(bool stacks) {
  return stacks ? torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false) : nullptr;
}

void push(History& h, TraceEntry e) {
  if (h.max_entries == 0) return;
  if (h.trace.size() >= h.max_entries) h.trace.pop_front();
  h.trace.push_back(std::move(e));
}

}  // namespace

bool memory_history_recording() { return g_recording.load(std::memory_order_relaxed); }

void memory_history_alloc(int device, void* ptr, size_t size, bool new_segment) {
  History& h = history();
  auto frames = gather(h.stacks);
  std::lock_guard<std::mutex> lock(h.mu);
  const int64_t t = now_us();
  if (new_segment) {
    nrn_segment_info info;
    if (nrn_mem_segment_of(ptr, &info) == NRN_SUCCESS)
      push(h, {"segment_alloc", device, reinterpret_cast<uint64_t>(info.base), info.size, t, frames});
  }
  push(h, {"alloc", device, reinterpret_cast<uint64_t>(ptr), size, t, frames});
  h.live[reinterpret_cast<uint64_t>(ptr)] = {device, size, frames};
}

void memory_history_free(void* ptr) {
  History& h = history();
  const uint64_t addr = reinterpret_cast<uint64_t>(ptr);
  std::shared_ptr<torch::CapturedTraceback> frames;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    auto it = h.live.find(addr);
    if (it == h.live.end()) return;  // allocated before recording started: nothing to pair it with
    frames = it->second.frames;
    const int64_t t = now_us();
    // Execution is synchronous: a freed block is reusable at once, so the request completes immediately.
    push(h, {"free_requested", it->second.device, addr, it->second.size, t, frames});
    push(h, {"free_completed", it->second.device, addr, it->second.size, t, frames});
    h.live.erase(it);
  }
}

void memory_history_oom(int device, size_t size) {
  History& h = history();
  auto frames = gather(h.stacks);
  std::lock_guard<std::mutex> lock(h.mu);
  push(h, {"oom", device, 0, size, now_us(), frames});
}

namespace {

void record(bool enabled, bool stacks, size_t max_entries) {
  History& h = history();
  if (enabled && stacks) torch::installCapturedTracebackPython();
  std::lock_guard<std::mutex> lock(h.mu);
  if (!enabled) {
    g_recording.store(false);
    h.trace.clear();
    h.live.clear();
    return;
  }
  h.stacks = stacks;
  h.max_entries = max_entries;
  while (h.trace.size() > h.max_entries) h.trace.pop_front();
  g_recording.store(true);
}

// {"segments": [...], "device_traces": [[...] per device]} as torch.cuda.memory._snapshot() returns.
py::dict snapshot() {
  ensure_init();
  const int ndev = device_count();
  History& h = history();
  std::vector<TraceEntry> trace;
  std::unordered_map<uint64_t, Live> live;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    trace.assign(h.trace.begin(), h.trace.end());
    live = h.live;
  }
  // Symbolise every traceback once (Python objects, with the GIL held).
  std::vector<torch::CapturedTraceback*> tbs;
  std::map<torch::CapturedTraceback*, size_t> index;
  auto note = [&](const std::shared_ptr<torch::CapturedTraceback>& tb) {
    if (tb && index.emplace(tb.get(), tbs.size()).second) tbs.push_back(tb.get());
  };
  for (const auto& e : trace) note(e.frames);
  for (const auto& kv : live) note(kv.second.frames);
  std::vector<py::object> symbolized = torch::py_symbolize(tbs);
  auto frames_of = [&](const std::shared_ptr<torch::CapturedTraceback>& tb) -> py::object {
    if (!tb) return py::list();
    return symbolized.at(index.at(tb.get()));
  };

  py::list segments;
  for (int d = 0; d < ndev; ++d) {
    size_t n = 0;
    NRN_CHECK(nrn_mem_snapshot(d, nullptr, 0, &n));
    std::vector<nrn_mem_block_info> blocks(n + 64);  // room for blocks split meanwhile (other threads)
    NRN_CHECK(nrn_mem_snapshot(d, blocks.data(), blocks.size(), &n));
    blocks.resize(std::min(n, blocks.size()));
    py::dict seg;
    py::list seg_blocks;
    uint64_t allocated = 0, requested = 0;
    auto close_segment = [&]() {
      if (seg.empty()) return;
      seg["allocated_size"] = allocated;
      seg["active_size"] = allocated;
      seg["requested_size"] = requested;
      seg["blocks"] = seg_blocks;
      segments.append(seg);
      seg = py::dict();
      seg_blocks = py::list();
      allocated = requested = 0;
    };
    for (const nrn_mem_block_info& b : blocks) {
      if (b.addr == b.segment_base) {
        close_segment();
        seg["device"] = d;
        seg["address"] = b.segment_base;
        seg["total_size"] = b.segment_size;
        seg["stream"] = 0;
        seg["segment_type"] = b.pool == NRN_POOL_SMALL ? "small" : "large";
        seg["segment_pool_id"] = py::make_tuple(0, 0);
        seg["is_expandable"] = false;
        seg["frames"] = py::list();
      }
      py::dict blk;
      blk["address"] = b.addr;
      blk["size"] = b.size;
      blk["requested_size"] = b.requested;
      blk["state"] = b.allocated ? "active_allocated" : "inactive";
      auto it = live.find(b.addr);
      blk["frames"] = b.allocated && it != live.end() ? frames_of(it->second.frames) : py::list();
      if (b.allocated) allocated += b.size, requested += b.requested;
      seg_blocks.append(blk);
    }
    close_segment();
  }
  py::list device_traces;
  for (int d = 0; d < ndev; ++d) device_traces.append(py::list());
  for (const auto& e : trace) {
    if (e.device < 0 || e.device >= ndev) continue;
    py::dict t;
    t["action"] = e.action;
    t["addr"] = e.addr;
    t["size"] = e.size;
    t["stream"] = 0;
    t["time_us"] = e.time_us;
    t["frames"] = frames_of(e.frames);
    if (std::string(e.action) == "oom") {
      uint64_t free_b = 0, total_b = 0;
      nrn_mem_get_info(e.device, &free_b, &total_b);
      t["device_free"] = free_b;
    }
    device_traces[e.device].cast<py::list>().append(t);
  }
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = device_traces;
  out["allocator_settings"] = py::dict();
  return out;
}

}  // namespace

void register_memory_history(py::module& m) {
  m.def("_record_memory_history", &record, py::arg("enabled"), py::arg("stacks"), py::arg("max_entries"));
  m.def("_memory_snapshot", &snapshot);
}

}  // namespace torch_neuronx
