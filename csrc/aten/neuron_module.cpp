// The Python module torch_neuronx._C: what torch.neuron needs beyond PyTorch's generic device APIs.
#include "aten/neuron_aten.h"

#include <torch/csrc/Generator.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <map>

namespace torch_neuronx {
std::map<std::string, std::pair<int64_t, int64_t>> op_counts();
void reset_op_counts();
int64_t exchange_cpu_bits_macs(int64_t macs);
std::vector<int64_t> winograd_cache_info();
void winograd_cache_clear();
void register_process_group(pybind11::module& m);
void route_composite_ops_to_cpu();
}  // namespace torch_neuronx

using namespace torch_neuronx;

namespace {
// The kernels' parallel loops on PyTorch's intra-op pool: one set of threads for our kernels, PyTorch's
// CPU kernels and the kernels torch.compile generates (see nk_parallel_set_runner).
void run_on_intraop_pool(int64_t n, int64_t grain, nk_range_fn fn, void* ctx) {
  at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) { fn(ctx, b, e); });
}
int intraop_threads() { return at::in_parallel_region() ? 1 : at::get_num_threads(); }
}  // namespace

namespace torch_neuronx {
void register_memory_history(pybind11::module& m);  // neuron_memory_history.cpp
}

PYBIND11_MODULE(_C, m) {
  torch_neuronx::register_memory_history(m);
  m.doc() = "TorchNeuron native binding";

  m.def("_init", [] {
    ensure_init();
    route_composite_ops_to_cpu();
    nk_parallel_set_runner(run_on_intraop_pool, intraop_threads);
  });
  m.def("_is_initialized", [] { return nrn_is_initialized(); });
  // torch.profiler ranges from Python: a compiled graph as one device event, each kernel Inductor generated
  // inside it (-1: no profiler records).
  m.def("_prof_range_begin", [](const std::string& name, int device) { return prof_range_begin(name, device); });
  m.def("_prof_range_end", [](int64_t token) { prof_range_end(token, ProfKernel::kGraph); });
  m.def("_prof_kernel_begin", [](const std::string& name, const std::vector<at::Tensor>& args) {
    return prof_kernel_begin(name, args);
  });
  m.def("_prof_kernel_end", [](int64_t token) { prof_range_end(token, ProfKernel::kGenerated); });
  m.def("_prof_active", [] { return g_prof_active.load(std::memory_order_relaxed); });
  // Never raises: a broken environment reports zero devices here; _init() explains why.
  m.def("_device_count", [] {
    int n = 0;
    if (nrn_init() != NRN_SUCCESS || nrn_device_count(&n) != NRN_SUCCESS) return 0;
    return n;
  });
  m.def("_init_error", [] {
    nrn_status s = nrn_init();
    return s == NRN_SUCCESS ? std::string() : std::string(nrn_last_error());
  });
  m.def("_get_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int64_t d) {
    check_device_index(d);
    NRN_CHECK(nrn_device_set_current(static_cast<int>(d)));
  });
  m.def("_check_device", [](int64_t d) { check_device_index(d); });
  m.def("_get_device_properties", [](int64_t d) {
    check_device_index(d);
    nrn_device_props p;
    NRN_CHECK(nrn_device_get_props(static_cast<int>(d), &p));
    pybind11::dict out;
    out["name"] = std::string(p.name);
    out["index"] = p.logical_index;
    out["physical_index"] = p.physical_index;
    out["chip"] = p.chip;
    out["physical_cores"] = p.physical_cores;
    out["major"] = p.major;
    out["minor"] = p.minor;
    out["total_memory"] = p.memory_capacity;
    out["sbuf_bytes"] = p.sbuf_bytes;
    out["psum_bytes"] = p.psum_bytes;
    return out;
  });
  m.def("_synchronize", [](int64_t d) {
    check_device_index(d);
    NRN_CHECK(nrn_device_synchronize(static_cast<int>(d)));
  });
  m.def("_get_default_generator", [](int64_t d) {
    const at::Generator& g = default_generator(static_cast<c10::DeviceIndex>(d));
    return pybind11::reinterpret_steal<pybind11::object>(THPGenerator_initDefaultGenerator(g));
  });
  m.def("_set_memory_capacity", [](int64_t d, uint64_t bytes) {
    check_device_index(d);
    NRN_CHECK(nrn_mem_set_capacity(static_cast<int>(d), bytes));
  });
  m.def("_op_counts", [] { return op_counts(); });
  m.def("_reset_op_counts", [] { reset_op_counts(); });
  m.def("_log_level", [] { return static_cast<int>(nrn_log_level_get()); });
  // fp32/fp64 products of at most this many multiply-adds run CPU's GEMM; returns the previous limit.
  m.def("_cpu_bits_macs", [](int64_t macs) { return exchange_cpu_bits_macs(macs); });
  // GEMM: the micro-kernel family in use and the machine's measured fp32 FMA peak (benchmarks).
  m.def("_gemm_isa", [] { return std::string(nk_gemm_isa_name()); });
  // The Winograd convolution's transformed-weight cache (neuron_ops_conv.cpp): [entries, bytes, hits, misses].
  m.def("_winograd_cache_info", [] { return winograd_cache_info(); });
  m.def("_winograd_cache_clear", [] { winograd_cache_clear(); });
  m.def("_fma_peak_gflops", [] {
    pybind11::gil_scoped_release no_gil;
    return nk_fma_peak_gflops();
  });
  // The bf16 peak and the instruction it ran on ("amx", "avx512_bf16", "none").
  m.def("_bf16_peak_gflops", [] {
    const char *method = "none";
    double gf;
    {
      pybind11::gil_scoped_release no_gil;
      gf = nk_bf16_peak_gflops(&method);
    }
    return pybind11::make_tuple(gf, std::string(method));
  });
  // NKI kernels lowered by nki/_compile.py: the instruction list and the region bases as addresses.
  m.def("_nki_exec", [](uintptr_t ins, int64_t n, uintptr_t bases, int64_t nbases) {
    int64_t failed = -1;
    nk_status s;
    {
      pybind11::gil_scoped_release no_gil;
      s = nkx_run(reinterpret_cast<const nkx_instr*>(ins), n, reinterpret_cast<void* const*>(bases), nbases,
                  &failed);
    }
    if (s == NK_NEG_INT_POWER)  // numpy's error for the same values, which the interpreter would raise
      throw pybind11::value_error("Integers to negative integer powers are not allowed. (nki compiled kernel, "
                                  "instruction " + std::to_string(failed) + ")");
    TORCH_CHECK(s == NK_SUCCESS, "nki compiled kernel: instruction ", failed, " failed with status ",
                static_cast<int>(s));
  });
  m.def("_nki_exec_layout", [] {
    int64_t l[3];
    nkx_layout(l);
    return std::vector<int64_t>{l[0], l[1], l[2]};
  });
  register_process_group(m);
}
