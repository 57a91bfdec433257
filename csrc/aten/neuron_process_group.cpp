// The "neuron" process group backend: c10d::Backend over the shared-memory collectives of
// csrc/collectives. It only unpacks tensors, calls C and raises errors. Ranks on different hosts, CPU
// tensors and TORCH_NEURONX_DIST_FORCE_GLOO=1 go through an inner Gloo backend created by the Python
// factory from the same store.
#include "aten/neuron_aten.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <exception>
#include <fstream>
#include <mutex>
#include <numeric>
#include <sys/stat.h>
#include <unistd.h>

extern "C" {
#include "collectives/neuron_collectives.h"
}

namespace torch_neuronx {
namespace {

[[noreturn]] void raise_ncl(ncl_status s, const std::string& op) {
  std::string msg = "neuron process group: " + op + " failed: " + ncl_last_error();
  if (s == NCL_INVALID || s == NCL_UNSUPPORTED) TORCH_CHECK(false, msg);
  C10_THROW_ERROR(DistBackendError, msg);
}

#define NCL_CHECK(expr, op)                       \
  do {                                            \
    ncl_status _s = (expr);                       \
    if (_s != NCL_SUCCESS) raise_ncl(_s, op);     \
  } while (0)

// A collective: once it is entered, the C layer synchronises the ranks even when it fails (see Call).
// `read` and `written` are the bytes this rank's buffers give and receive, the traffic no algorithm avoids
// (benchmarks/report.py bounds a collective by it): the profiler's "bytes" of the collective.
#define NCL_RUN(expr, op, read, written)          \
  do {                                            \
    ::torch_neuronx::ProfKernel _neuron_prof(op, ::torch_neuronx::ProfKernel::kCollective); \
    _neuron_prof.bytes(read, written);            \
    entered_ = true;                              \
    ncl_status _s = (expr);                       \
    if (_s != NCL_SUCCESS) raise_ncl(_s, op);     \
    entered_ = false;                             \
  } while (0)

// The dtype the collectives see. Copy-only collectives move any dtype as bytes.
bool ncl_dtype_of(at::ScalarType st, ncl_dtype* out) {
  nk_dtype d;
  if (!nk_dtype_of(st, &d)) return false;
  *out = static_cast<ncl_dtype>(d);  // same numbering
  return true;
}

ncl_redop redop_of(const c10d::ReduceOp& op, double* factor, const char* what) {
  *factor = 1.0;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return NCL_SUM;
    case c10d::ReduceOp::AVG: return NCL_AVG;
    case c10d::ReduceOp::PRODUCT: return NCL_PRODUCT;
    case c10d::ReduceOp::MIN: return NCL_MIN;
    case c10d::ReduceOp::MAX: return NCL_MAX;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(sup != nullptr, what, ": PREMUL_SUM without a factor");
      *factor = sup->tensor_factor.defined() ? sup->tensor_factor.item<double>() : sup->double_factor;
      return NCL_PREMUL_SUM;
    }
    default:
      TORCH_CHECK(false, what, ": the neuron process group does not support reduce op ",
                  static_cast<int>(op.op_), " (supported: SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM)");
  }
}

// Gloo has no AVG or PREMUL_SUM: on the Gloo path they become SUM with the factor applied to a copy of
// the input and the division applied to the result.
struct GlooReduce {
  c10d::ReduceOp op;
  bool avg = false;
  bool premul = false;
  double factor = 1.0;
};

GlooReduce gloo_reduce(const c10d::ReduceOp& op) {
  GlooReduce g{op};
  if (op.op_ == c10d::ReduceOp::AVG || op.op_ == c10d::ReduceOp::PREMUL_SUM) {
    g.avg = op.op_ == c10d::ReduceOp::AVG;
    g.premul = !g.avg;
    if (g.premul) redop_of(op, &g.factor, "gloo");
    g.op = c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
  return g;
}

void gloo_finish(const GlooReduce& g, std::vector<at::Tensor>& outs, int size) {
  if (!g.avg) return;
  // Gloo may finish writing its outputs after wait() returns for some ops: floats use the
  // pre-multiplication instead (see gloo_reduce_for), so only integer results are divided here.
  for (auto& t : outs) {
    if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) t.div_(size);
    else t.copy_(at::div(t, size, "trunc"));
  }
}

// Floating AVG becomes PREMUL_SUM(1/size), applied before the collective.
GlooReduce gloo_reduce_for(const c10d::ReduceOp& op, const at::Tensor& t, int size) {
  GlooReduce g = gloo_reduce(op);
  if (g.avg && (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()))) {
    g.avg = false;
    g.premul = true;
    g.factor = 1.0 / size;
  }
  return g;
}

// A collective that already ran on the calling thread (execution on neuron is synchronous), or a send
// whose buffer the receiver may still be reading.
class NeuronWork : public c10d::Work {
 public:
  NeuronWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), outputs_(std::move(outputs)) {}
  NeuronWork(int rank, ncl_comm* comm, std::mutex* mu, int peer, uint64_t ticket, at::Tensor buf)
      : c10d::Work(rank, c10d::OpType::SEND), outputs_{std::move(buf)}, comm_(comm), mu_(mu), peer_(peer),
        ticket_(ticket) {}

  bool isCompleted() override {
    if (comm_ == nullptr || done_) return true;
    std::lock_guard<std::mutex> g(*mu_);
    bool done = false;
    if (ncl_send_test(comm_, peer_, ticket_, &done) != NCL_SUCCESS) return true;
    done_ = done;
    return done;
  }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds timeout) override {
    if (comm_ != nullptr && !done_) {
      std::lock_guard<std::mutex> g(*mu_);
      NCL_CHECK(ncl_send_wait(comm_, peer_, ticket_), "send");
      done_ = true;
    }
    return true;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    wait(std::chrono::milliseconds(0));
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    fut->markCompleted(c10::IValue(outputs_));
    return fut;
  }

 private:
  std::vector<at::Tensor> outputs_;
  ncl_comm* comm_ = nullptr;
  std::mutex* mu_ = nullptr;
  int peer_ = -1;
  uint64_t ticket_ = 0;
  bool done_ = false;
};

// Identifies a host and a pid namespace: ranks that share it can map each other's memory.
std::string host_identity() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  struct stat sb{};
  stat("/proc/self/ns/pid", &sb);
  return std::string(host) + "|" + boot + "|" + std::to_string(sb.st_ino);
}

class NeuronBackend : public c10d::Backend {
 public:
  NeuronBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
                c10::intrusive_ptr<c10d::Backend> gloo, bool force_gloo)
      : c10d::Backend(rank, size), gloo_(std::move(gloo)), timeout_s_(timeout_s), force_gloo_(force_gloo) {
    // Every rank publishes its workspace and host identity; shared memory is used only if all ranks
    // are on this host (the decision is the same on every rank: it depends on published values only).
    ncl_rank_info info{};
    std::string host = host_identity();
    bool local = !force_gloo;
    if (local) {
      NCL_CHECK(ncl_comm_create(rank, size, timeout_s, &comm_), "init");
      ncl_comm_info(comm_, &info);
    }
    std::vector<uint8_t> blob(sizeof info + host.size() + 1);
    blob[0] = local ? 1 : 0;
    std::memcpy(blob.data() + 1, &info, sizeof info);
    std::memcpy(blob.data() + 1 + sizeof info, host.data(), host.size());
    store->set("neuron/rank/" + std::to_string(rank), blob);
    std::vector<ncl_rank_info> infos(size);
    for (int r = 0; r < size; r++) {
      std::vector<uint8_t> b = store->get("neuron/rank/" + std::to_string(r));
      TORCH_CHECK(b.size() >= 1 + sizeof info, "neuron process group: bad rendezvous record of rank ", r);
      std::memcpy(&infos[r], b.data() + 1, sizeof info);
      std::string h(b.begin() + 1 + sizeof info, b.end());
      if (b[0] == 0 || h != host) local = false;
    }
    if (!local) {
      ncl_comm_destroy(comm_);
      comm_ = nullptr;
      TORCH_CHECK(gloo_, "neuron process group: ranks span several hosts (or Gloo was forced) but no Gloo "
                  "backend is available");
      return;
    }
    ncl_status s = ncl_comm_connect(comm_, infos.data());
    if (s != NCL_SUCCESS) {
      std::string msg = ncl_last_error();
      ncl_comm_abort(comm_, msg.c_str());
      ncl_comm_destroy(comm_);
      comm_ = nullptr;
      C10_THROW_ERROR(DistBackendError, "neuron process group: connecting the ranks failed: " + msg);
    }
  }

  ~NeuronBackend() override { shutdown(); }

  void shutdown() override {
    std::lock_guard<std::mutex> g(mu_);
    pending_.clear();
    gloo_pending_.clear();
    last_split_.reset();
    ncl_comm_destroy(comm_);
    comm_ = nullptr;
  }

  const std::string getBackendName() const override { return "neuron"; }

  c10::intrusive_ptr<Options> getBackendOptions() override {
    return c10::make_intrusive<Options>("neuron", std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000)));
  }

  // DeviceMesh and split_group make sub-groups by splitting when the default group is bound to a device
  // (init_process_group(device_id=...)). The ranks of the new group build it like a fresh one, from the
  // store split_group gives them, through the Python factory (which also makes the inner Gloo backend).
  bool supportsSplitting() const override { return true; }

  // Collectives started on this group: equal on every rank while the ranks agree, so c10d can use it to
  // spot desynchronisation. A new (or split) group starts at 0 on every rank.
  void setSequenceNumberForGroup() override { seq_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    std::string name = opts ? opts->group_name : std::string();
    // ProcessGroup::splitGroup splits once per device type (neuron and cpu share this backend): both
    // get the same child.
    if (!name.empty() && name == last_split_name_ && last_split_) return last_split_;
    double timeout_s = opts && opts->timeout.count() > 0 ? opts->timeout.count() / 1000.0 : timeout_s_;
    int new_rank = static_cast<int>(it - ranks.begin()), new_size = static_cast<int>(ranks.size());
    c10::intrusive_ptr<NeuronBackend> child;
    {
      pybind11::gil_scoped_acquire gil;
      pybind11::object made = pybind11::module::import("torch_neuronx.distributed")
                                  .attr("_create_split_backend")(store, new_rank, new_size, timeout_s, force_gloo_);
      child = made.cast<c10::intrusive_ptr<NeuronBackend>>();
    }
    last_split_name_ = name;
    last_split_ = child;
    return child;
  }
  bool usesSharedMemory() const { return comm_ != nullptr; }

  void setTimeout(std::chrono::milliseconds timeout) override {
    timeout_s_ = timeout.count() / 1000.0;
    if (comm_) ncl_comm_set_timeout(comm_, timeout_s_);
    if (gloo_) gloo_->setTimeout(timeout);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    if (auto w = maybe_gloo(tensors, {}, [&](auto& in, auto&) { return gloo_->broadcast(in, opts); }))
      return w;
    Call call(this, "broadcast", opts.timeout);
    at::Tensor t = single(tensors, "broadcast");
    check_root(opts.rootRank, "broadcast");
    Buf b = buf(t, "broadcast");
    announce(t);
    bool root = opts.rootRank == rank_;
    NCL_RUN(ncl_broadcast(comm_, b.ptr, b.count, b.dt, static_cast<int>(opts.rootRank)), "broadcast",
            root ? nbytes(t) : 0, root ? 0 : nbytes(t));
    return done(c10d::OpType::BROADCAST, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (auto w = maybe_gloo(tensors, {}, [&](auto& in, auto&) {
          GlooReduce g = gloo_reduce(opts.reduceOp);
          c10d::AllreduceOptions o = opts;
          o.reduceOp = g.op;
          if (g.premul)
            for (auto& t : in) t.mul_(g.factor);
          auto w = gloo_->allreduce(in, o);
          w->wait();
          gloo_finish(g, in, size_);
          return w;
        }))
      return w;
    Call call(this, "all_reduce", opts.timeout);
    all_reduce_one(single(tensors, "all_reduce"), opts.reduceOp, "all_reduce");
    return done(c10d::OpType::ALLREDUCE, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    if (auto w = maybe_gloo(tensors, {}, [&](auto& in, auto&) {
          for (auto& t : in) {
            std::vector<at::Tensor> one{t};
            c10d::AllreduceOptions o;
            o.reduceOp = opts.reduceOp;
            o.timeout = opts.timeout;
            allreduce(one, o)->wait();
          }
          return done(c10d::OpType::ALLREDUCE_COALESCED, in);
        }))
      return w;
    Call call(this, "all_reduce_coalesced", opts.timeout);
    for (auto& t : tensors) all_reduce_one(t, opts.reduceOp, "all_reduce_coalesced");
    return done(c10d::OpType::ALLREDUCE_COALESCED, tensors);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    if (auto w = maybe_gloo(tensors, {}, [&](auto& in, auto&) {
          GlooReduce g = gloo_reduce(opts.reduceOp);
          c10d::ReduceOptions o = opts;
          o.reduceOp = g.op;
          std::vector<at::Tensor> saved;
          for (auto& t : in) saved.push_back(t.clone());
          if (g.premul)
            for (auto& t : in) t.mul_(g.factor);
          auto w = gloo_->reduce(in, o);
          w->wait();
          if (opts.rootRank == rank_) gloo_finish(g, in, size_);
          else  // non-roots keep their input, as on the shared-memory path
            for (size_t i = 0; i < in.size(); i++) in[i].copy_(saved[i]);
          return w;
        }))
      return w;
    Call call(this, "reduce", opts.timeout);
    at::Tensor t = single(tensors, "reduce");
    check_root(opts.rootRank, "reduce");
    double factor;
    ncl_redop op = redop_of(opts.reduceOp, &factor, "reduce");
    Buf b = buf(t, "reduce", true);
    bool root = opts.rootRank == rank_;
    announce(t);
    NCL_RUN(ncl_reduce(comm_, b.ptr, root ? b.ptr : nullptr, b.count, b.dt, op, factor,
                         static_cast<int>(opts.rootRank)),
              "reduce", nbytes(t), root ? nbytes(t) : 0);
    return done(c10d::OpType::REDUCE, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    if (auto w = maybe_gloo(inputs, flat(outputs), [&](auto& in, auto&) {
          return gloo_->allgather(outputs, in, opts);
        }, &outputs))
      return w;
    Call call(this, "all_gather", opts.timeout);
    at::Tensor in = single(inputs, "all_gather");
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_),
                "all_gather: expected one list of ", size_, " output tensors");
    Buf b = buf(in, "all_gather");
    std::vector<void*> recv(size_);
    for (int r = 0; r < size_; r++) {
      same_shape(outputs[0][r], in, "all_gather", "output", r);
      recv[r] = buf(outputs[0][r], "all_gather").ptr;
    }
    announce(in);
    NCL_RUN(ncl_all_gather(comm_, b.ptr, recv.data(), b.count, b.dt), "all_gather", nbytes(in), size_ * nbytes(in));
    return done(c10d::OpType::ALLGATHER, outputs[0]);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    std::vector<at::Tensor> ins{input}, outs{output};
    if (auto w = maybe_gloo(ins, outs, [&](auto& in, auto& out) {
          return gloo_->_allgather_base(out[0], in[0], opts);
        }))
      return w;
    Call call(this, "all_gather_into_tensor", opts.timeout);
    all_gather_tensor(output, input);
    return done(c10d::OpType::_ALLGATHER_BASE, outs);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    if (auto w = maybe_gloo(inputs, outputs, [&](auto& in, auto& out) {
          return gloo_->allgather_into_tensor_coalesced(out, in, opts);
        }))
      return w;
    Call call(this, "all_gather_into_tensor_coalesced", opts.timeout);
    TORCH_CHECK(outputs.size() == inputs.size(), "all_gather_into_tensor_coalesced: ", outputs.size(),
                " outputs for ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); i++) all_gather_tensor(outputs[i], inputs[i]);
    return done(c10d::OpType::COALESCED, outputs);
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "allgather_coalesced: ", outputs.size(), " output lists for ",
                inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); i++) {
      std::vector<std::vector<at::Tensor>> o{outputs[i]};
      std::vector<at::Tensor> in{inputs[i]};
      allgather(o, in, opts)->wait();
    }
    return done(c10d::OpType::ALLGATHER_COALESCED, flat(outputs));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    if (auto w = maybe_gloo(flat(inputs), outputs, [&](auto&, auto& out) {
          GlooReduce g = gloo_reduce(opts.reduceOp);
          c10d::ReduceScatterOptions o = opts;
          o.reduceOp = g.op;
          std::vector<std::vector<at::Tensor>> in = inputs;
          if (g.premul)
            for (auto& l : in)
              for (auto& t : l) t = t.mul(g.factor);
          auto w = gloo_->reduce_scatter(out, in, o);
          w->wait();
          gloo_finish(g, out, size_);
          return w;
        }, nullptr, &inputs))
      return w;
    Call call(this, "reduce_scatter", opts.timeout);
    at::Tensor out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_),
                "reduce_scatter: expected one list of ", size_, " input tensors");
    double factor;
    ncl_redop op = redop_of(opts.reduceOp, &factor, "reduce_scatter");
    Buf b = buf(out, "reduce_scatter", true);
    std::vector<const void*> send(size_);
    for (int r = 0; r < size_; r++) {
      same_shape(inputs[0][r], out, "reduce_scatter", "input", r);
      send[r] = buf(inputs[0][r], "reduce_scatter", true).ptr;
    }
    announce(out);
    NCL_RUN(ncl_reduce_scatter(comm_, send.data(), b.ptr, b.count, b.dt, op, factor), "reduce_scatter",
            size_ * nbytes(out), nbytes(out));
    return done(c10d::OpType::REDUCE_SCATTER, outputs);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> ins{input}, outs{output};
    if (auto w = maybe_gloo(ins, outs, [&](auto& in, auto& out) {
          GlooReduce g = gloo_reduce_for(opts.reduceOp, in[0], size_);
          if (g.avg) {  // integer AVG: through the list form, whose result is final at wait()
            std::vector<std::vector<at::Tensor>> lists{in[0].reshape({-1}).chunk(size_)};
            std::vector<at::Tensor> o1{out[0].view({-1})};
            return reduce_scatter(o1, lists, opts);
          }
          c10d::ReduceScatterOptions o = opts;
          o.reduceOp = g.op;
          at::Tensor src = g.premul ? in[0].mul(g.factor) : in[0];
          std::vector<at::Tensor> dst{out[0]};  // Gloo may rebind its output argument
          auto w = gloo_->_reduce_scatter_base(out[0], src, o);
          w->wait();
          gloo_finish(g, dst, size_);
          return w;
        }))
      return w;
    Call call(this, "reduce_scatter_tensor", opts.timeout);
    reduce_scatter_tensor(output, input, opts.reduceOp);
    return done(c10d::OpType::_REDUCE_SCATTER_BASE, outs);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    if (auto w = maybe_gloo(inputs, outputs, [&](auto& in, auto& out) {
          for (size_t i = 0; i < in.size(); i++) _reduce_scatter_base(out[i], in[i], opts)->wait();
          return done(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, out);
        }))
      return w;
    Call call(this, "reduce_scatter_tensor_coalesced", opts.timeout);
    TORCH_CHECK(outputs.size() == inputs.size(), "reduce_scatter_tensor_coalesced: ", outputs.size(),
                " outputs for ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); i++) reduce_scatter_tensor(outputs[i], inputs[i], opts.reduceOp);
    return done(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, outputs);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    std::vector<at::Tensor> ins{input}, outs{output};
    if (auto w = maybe_gloo(ins, outs, [&](auto& in, auto& out) {
          return gloo_->alltoall_base(out[0], in[0], output_splits, input_splits, opts);
        }))
      return w;
    Call call(this, "all_to_all_single", opts.timeout);
    TORCH_CHECK(input.scalar_type() == output.scalar_type(), "all_to_all_single: input dtype ",
                input.scalar_type(), " differs from output dtype ", output.scalar_type());
    Buf in = buf(input, "all_to_all_single"), out = buf(output, "all_to_all_single");
    std::vector<int64_t> sc = splits(input, input_splits, "input"), rc = splits(output, output_splits, "output");
    std::vector<const void*> send(size_);
    std::vector<void*> recv(size_);
    int64_t es = static_cast<int64_t>(ncl_dtype_size(in.dt));
    int64_t so = 0, ro = 0;
    for (int r = 0; r < size_; r++) {
      send[r] = static_cast<char*>(in.ptr) + so * es;
      recv[r] = static_cast<char*>(out.ptr) + ro * es;
      so += sc[r];
      ro += rc[r];
    }
    announce(input);
    NCL_RUN(ncl_all_to_all(comm_, send.data(), sc.data(), recv.data(), rc.data(), in.dt), "all_to_all_single",
            nbytes(input), nbytes(output));
    return done(c10d::OpType::ALLTOALL_BASE, outs);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    if (auto w = maybe_gloo(inputs, outputs, [&](auto& in, auto& out) {
          // Gloo's alltoall wants equal sizes: run the uneven case as one flat alltoall_base.
          std::vector<at::Tensor> fi, fo;
          std::vector<int64_t> si, so;
          for (auto& t : in) {
            fi.push_back(t.reshape(-1));
            si.push_back(t.numel());
          }
          for (auto& t : out) {
            fo.push_back(t.reshape(-1));
            so.push_back(t.numel());
          }
          int64_t total = std::accumulate(so.begin(), so.end(), int64_t{0});
          at::Tensor flat_in = at::cat(fi);
          at::Tensor flat_out = at::empty({total}, flat_in.options());
          std::vector<int64_t> so_arg = so, si_arg = si;  // the callee may consume its split vectors
          auto w = alltoall_base(flat_out, flat_in, so_arg, si_arg, opts);
          w->wait();
          int64_t off = 0;
          for (size_t r = 0; r < out.size(); r++) {
            out[r].copy_(flat_out.narrow(0, off, so[r]).view(out[r].sizes()));
            off += so[r];
          }
          return w;
        }))
      return w;
    Call call(this, "all_to_all", opts.timeout);
    TORCH_CHECK(inputs.size() == static_cast<size_t>(size_) && outputs.size() == static_cast<size_t>(size_),
                "all_to_all: expected ", size_, " input and output tensors, got ", inputs.size(), " and ",
                outputs.size());
    std::vector<const void*> send(size_);
    std::vector<void*> recv(size_);
    std::vector<int64_t> sc(size_), rc(size_);
    ncl_dtype dt = NCL_U8;
    int64_t read = 0, written = 0;
    for (int r = 0; r < size_; r++) {
      read += nbytes(inputs[r]);
      written += nbytes(outputs[r]);
      TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                      outputs[r].scalar_type() == inputs[0].scalar_type(),
                  "all_to_all: all tensors must have the same dtype");
      Buf i = buf(inputs[r], "all_to_all"), o = buf(outputs[r], "all_to_all");
      send[r] = i.ptr;
      recv[r] = o.ptr;
      sc[r] = i.count;
      rc[r] = o.count;
      dt = i.dt;
    }
    NCL_RUN(ncl_all_to_all(comm_, send.data(), sc.data(), recv.data(), rc.data(), dt), "all_to_all", read, written);
    return done(c10d::OpType::ALLTOALL, outputs);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    if (auto w = maybe_gloo(inputs, flat(outputs), [&](auto& in, auto&) {
          return gloo_->gather(outputs, in, opts);
        }, &outputs))
      return w;
    Call call(this, "gather", opts.timeout);
    at::Tensor in = single(inputs, "gather");
    check_root(opts.rootRank, "gather");
    Buf b = buf(in, "gather");
    std::vector<void*> recv(size_);
    bool root = opts.rootRank == rank_;
    if (root) {
      TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_),
                  "gather: the root expects one list of ", size_, " output tensors");
      for (int r = 0; r < size_; r++) {
        same_shape(outputs[0][r], in, "gather", "output", r);
        recv[r] = buf(outputs[0][r], "gather").ptr;
      }
    }
    announce(in);
    NCL_RUN(ncl_gather(comm_, b.ptr, root ? recv.data() : nullptr, b.count, b.dt,
                         static_cast<int>(opts.rootRank)),
              "gather", nbytes(in), root ? size_ * nbytes(in) : 0);
    return done(c10d::OpType::GATHER, root ? outputs[0] : std::vector<at::Tensor>{});
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    if (auto w = maybe_gloo(flat(inputs), outputs, [&](auto&, auto& out) {
          return gloo_->scatter(out, inputs, opts);
        }, nullptr, &inputs))
      return w;
    Call call(this, "scatter", opts.timeout);
    at::Tensor out = single(outputs, "scatter");
    check_root(opts.rootRank, "scatter");
    Buf b = buf(out, "scatter");
    std::vector<const void*> send(size_);
    bool root = opts.rootRank == rank_;
    if (root) {
      TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_),
                  "scatter: the root expects one list of ", size_, " input tensors");
      for (int r = 0; r < size_; r++) {
        same_shape(inputs[0][r], out, "scatter", "input", r);
        send[r] = buf(inputs[0][r], "scatter").ptr;
      }
    }
    announce(out);
    NCL_RUN(ncl_scatter(comm_, root ? send.data() : nullptr, b.ptr, b.count, b.dt,
                          static_cast<int>(opts.rootRank)),
              "scatter", root ? size_ * nbytes(out) : 0, nbytes(out));
    return done(c10d::OpType::SCATTER, outputs);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    if (!comm_ || tensors_on_cpu(tensors)) return gloo_p2p(tensors, [&](auto& t) { return gloo_->send(t, dst, tag); });
    Call call(this, nullptr, c10d::kUnsetTimeout);
    at::Tensor t = single(tensors, "send");
    Buf b = buf(t, "send");
    uint64_t ticket = 0;
    NCL_CHECK(ncl_send(comm_, b.ptr, b.count * static_cast<int64_t>(ncl_dtype_size(b.dt)), dst, tag, &ticket),
              "send");
    // The receiver reads this memory: keep the tensor alive until it is consumed, even if the Work is
    // dropped.
    pending_.push_back({dst, ticket, t});
    return c10::make_intrusive<NeuronWork>(rank_, comm_, &mu_, dst, ticket, t);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    if (!comm_ || tensors_on_cpu(tensors)) return gloo_p2p(tensors, [&](auto& t) { return gloo_->recv(t, src, tag); });
    Call call(this, nullptr, c10d::kUnsetTimeout);
    at::Tensor t = single(tensors, "recv");
    Buf b = buf(t, "recv");
    NCL_CHECK(ncl_recv(comm_, b.ptr, b.count * static_cast<int64_t>(ncl_dtype_size(b.dt)), src, tag), "recv");
    return done(c10d::OpType::RECV, tensors);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    if (!comm_) return gloo_->recvAnysource(tensors, tag);
    TORCH_CHECK(false, "neuron process group: recv without a source rank is not supported");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    if (!comm_) return gloo_->barrier(opts);
    Call call(this, "barrier", opts.timeout);
    NCL_RUN(ncl_barrier(comm_), "barrier", 0, 0);
    return done(c10d::OpType::BARRIER, {});
  }

  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    TORCH_CHECK(gloo_, "neuron process group: monitored_barrier needs the Gloo backend");
    gloo_->monitoredBarrier(opts, wait_all_ranks);
  }

 private:
  struct Buf {
    void* ptr;
    int64_t count;
    ncl_dtype dt;
  };
  struct Pending {
    int peer;
    uint64_t ticket;
    at::Tensor t;
  };

  // Holds the communicator for one call and applies a per-call timeout. If this rank's arguments are
  // rejected before it reaches the collective (a TORCH_CHECK on sizes, dtypes, ...), it still takes part
  // in the call's start, flagged, so the peers raise at once instead of waiting for the timeout.
  struct Call {
    NeuronBackend* pg;
    const char* what;  // nullptr: point to point (no collective to take part in)
    std::unique_lock<std::mutex> lock;
    bool custom;
    int exceptions;
    Call(NeuronBackend* p, const char* w, std::chrono::milliseconds timeout) : pg(p), what(w), lock(p->mu_) {
      TORCH_CHECK(pg->comm_ != nullptr, "neuron process group: the group was shut down");
      pg->seq_++;
      pg->entered_ = false;
      exceptions = std::uncaught_exceptions();
      pg->prune_pending();
      custom = timeout != c10d::kUnsetTimeout && timeout.count() > 0;
      if (custom) ncl_comm_set_timeout(pg->comm_, timeout.count() / 1000.0);
    }
    ~Call() {
      if (what && !pg->entered_ && std::uncaught_exceptions() > exceptions && pg->comm_) {
        std::string reason = std::string("its arguments to ") + what + " were rejected (the error on that rank says why)";
        ncl_call_reject(pg->comm_, what, reason.c_str());
      }
      if (custom && pg->comm_) ncl_comm_set_timeout(pg->comm_, pg->timeout_s_);
    }
  };

  void prune_pending() {
    std::vector<Pending> keep;
    for (auto& p : pending_) {
      bool d = true;
      if (ncl_send_test(comm_, p.peer, p.ticket, &d) == NCL_SUCCESS && !d) keep.push_back(p);
    }
    pending_.swap(keep);
  }

  static std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& v) {
    std::vector<at::Tensor> out;
    for (auto& l : v) out.insert(out.end(), l.begin(), l.end());
    return out;
  }

  // CPU tensors, or every op when there is no shared-memory communicator, go to Gloo. Neuron tensors
  // reach Gloo as CPU aliases of their memory (device memory is host-addressable), and the call
  // completes before returning since the aliases do not keep the memory alive.
  template <typename F>
  c10::intrusive_ptr<c10d::Work> maybe_gloo(const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs,
                                            F&& fn, std::vector<std::vector<at::Tensor>>* out_lists = nullptr,
                                            std::vector<std::vector<at::Tensor>>* in_lists = nullptr) {
    bool any_neuron = false, any_cpu = false;
    for (auto* v : {&ins, &outs})
      for (auto& t : *v) {
        if (t.device().is_privateuseone()) any_neuron = true;
        else if (t.device().is_cpu()) any_cpu = true;
        else TORCH_CHECK(false, "neuron process group: tensors on ", t.device(), " are not supported");
      }
    TORCH_CHECK(!(any_neuron && any_cpu), "neuron process group: a collective mixes neuron and CPU tensors");
    if (comm_ && !any_cpu) return {};
    TORCH_CHECK(gloo_, "neuron process group: CPU tensors need the Gloo backend");
    if (!any_neuron) {
      std::vector<at::Tensor> i = ins, o = outs;
      return fn(i, o);
    }
    std::vector<at::Tensor> i, o;
    for (auto& t : ins) i.push_back(cpu_alias(t));
    for (auto& t : outs) o.push_back(cpu_alias(t));
    std::vector<std::vector<at::Tensor>> saved_out, saved_in;
    if (out_lists) {
      saved_out = *out_lists;
      for (auto& l : *out_lists)
        for (auto& t : l) t = cpu_alias(t);
    }
    if (in_lists) {
      saved_in = *in_lists;
      for (auto& l : *in_lists)
        for (auto& t : l) t = cpu_alias(t);
    }
    auto w = fn(i, o);
    w->wait();
    if (out_lists) *out_lists = saved_out;
    if (in_lists) *in_lists = saved_in;
    std::vector<at::Tensor> res = outs.empty() ? ins : outs;
    return c10::make_intrusive<NeuronWork>(rank_, c10d::OpType::UNKNOWN, res);
  }

  static bool tensors_on_cpu(const std::vector<at::Tensor>& v) {
    for (auto& t : v)
      if (t.device().is_cpu()) return true;
    return false;
  }

  // Point-to-point through Gloo stays asynchronous (isend/irecv pairs must not block each other): the
  // neuron tensors behind the CPU aliases are kept alive until Gloo's work completes.
  template <typename F>
  c10::intrusive_ptr<c10d::Work> gloo_p2p(std::vector<at::Tensor>& tensors, F&& fn) {
    TORCH_CHECK(gloo_, "neuron process group: CPU tensors need the Gloo backend");
    std::vector<at::Tensor> t;
    bool neuron = false;
    for (auto& x : tensors) {
      neuron |= x.device().is_privateuseone();
      t.push_back(x.device().is_privateuseone() ? cpu_alias(x) : x);
    }
    auto w = fn(t);
    if (neuron) {
      std::lock_guard<std::mutex> g(mu_);
      std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, std::vector<at::Tensor>>> keep;
      for (auto& p : gloo_pending_)
        if (!p.first->isCompleted()) keep.push_back(p);
      keep.emplace_back(w, tensors);
      gloo_pending_.swap(keep);
    }
    return w;
  }

  c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, const std::vector<at::Tensor>& outs) {
    return c10::make_intrusive<NeuronWork>(rank_, type, outs);
  }

  // The shape the next collective names in a mismatch error (the header carries it; no extra sync).
  void announce(const at::Tensor& t) {
    ncl_comm_set_shape(comm_, static_cast<int>(t.dim()), t.sizes().data());
  }

  static int64_t nbytes(const at::Tensor& t) {
    return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
  }

  at::Tensor single(const std::vector<at::Tensor>& v, const char* what) {
    TORCH_CHECK(v.size() == 1, what, ": the neuron process group takes exactly one tensor per rank, got ",
                v.size());
    return v[0];
  }

  void check_root(int64_t root, const char* what) {
    TORCH_CHECK(root >= 0 && root < size_, what, ": invalid root rank ", root, " for a group of ", size_);
  }

  static void same_shape(const at::Tensor& t, const at::Tensor& ref, const char* what, const char* role, int r) {
    TORCH_CHECK(t.scalar_type() == ref.scalar_type(), what, ": ", role, " tensor ", r, " has dtype ",
                t.scalar_type(), " but expected ", ref.scalar_type());
    TORCH_CHECK(t.numel() == ref.numel(), what, ": ", role, " tensor ", r, " has ", t.numel(),
                " elements but expected ", ref.numel(), " (shape ", ref.sizes(), ")");
  }

  // A contiguous neuron tensor as (pointer, count, dtype). Reductions need a dtype the kernels know
  // (complex is reduced as pairs of reals); other collectives move any dtype as bytes.
  Buf buf(const at::Tensor& t0, const char* what, bool reducing = false) {
    at::Tensor t = t0;
    TORCH_CHECK(t.device().is_privateuseone(), what, ": expected a neuron tensor, got one on ", t.device());
    TORCH_CHECK(t.is_contiguous(), what, ": tensors must be contiguous (got sizes ", t.sizes(), ", strides ",
                t.strides(), ")");
    TORCH_CHECK(!t.is_sparse(), what, ": sparse tensors are not supported");
    if (t.is_complex()) t = at::view_as_real(t);
    ncl_dtype dt;
    if (ncl_dtype_of(t.scalar_type(), &dt)) return {t.data_ptr(), t.numel(), dt};
    TORCH_CHECK(!reducing, what, ": reductions do not support dtype ", t0.scalar_type());
    return {t.data_ptr(), static_cast<int64_t>(t.numel() * t.element_size()), NCL_U8};
  }

  void all_reduce_one(const at::Tensor& t, const c10d::ReduceOp& rop, const char* what) {
    double factor;
    ncl_redop op = redop_of(rop, &factor, what);
    TORCH_CHECK(!t.is_complex() || op == NCL_SUM || op == NCL_AVG || op == NCL_PREMUL_SUM, what,
                ": complex tensors support SUM, AVG and PREMUL_SUM only");
    Buf b = buf(t, what, true);
    announce(t);
    NCL_RUN(ncl_all_reduce(comm_, b.ptr, b.ptr, b.count, b.dt, op, factor), what, nbytes(t), nbytes(t));
  }

  void all_gather_tensor(at::Tensor& output, const at::Tensor& input) {
    const char* what = "all_gather_into_tensor";
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), what, ": output dtype ", output.scalar_type(),
                " differs from input dtype ", input.scalar_type());
    TORCH_CHECK(output.numel() == input.numel() * size_, what, ": output has ", output.numel(),
                " elements but the input has ", input.numel(), " and the group has ", size_, " ranks");
    Buf in = buf(input, what), out = buf(output, what);
    std::vector<void*> recv(size_);
    size_t piece = static_cast<size_t>(in.count) * ncl_dtype_size(in.dt);
    for (int r = 0; r < size_; r++) recv[r] = static_cast<char*>(out.ptr) + piece * r;
    announce(input);
    NCL_RUN(ncl_all_gather(comm_, in.ptr, recv.data(), in.count, in.dt), what, nbytes(input), nbytes(output));
  }

  void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, const c10d::ReduceOp& rop) {
    const char* what = "reduce_scatter_tensor";
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), what, ": output dtype ", output.scalar_type(),
                " differs from input dtype ", input.scalar_type());
    TORCH_CHECK(input.numel() == output.numel() * size_, what, ": input has ", input.numel(),
                " elements but the output has ", output.numel(), " and the group has ", size_, " ranks");
    double factor;
    ncl_redop op = redop_of(rop, &factor, what);
    Buf in = buf(input, what, true), out = buf(output, what, true);
    std::vector<const void*> send(size_);
    size_t piece = static_cast<size_t>(out.count) * ncl_dtype_size(out.dt);
    for (int r = 0; r < size_; r++) send[r] = static_cast<const char*>(in.ptr) + piece * r;
    announce(input);
    NCL_RUN(ncl_reduce_scatter(comm_, send.data(), out.ptr, out.count, out.dt, op, factor), what, nbytes(input),
            nbytes(output));
  }

  // Element counts per rank of an all_to_all_single split along dim 0 (equal when no splits given).
  std::vector<int64_t> splits(const at::Tensor& t, const std::vector<int64_t>& s, const char* role) {
    int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    // In the units buf() reports: elements, real parts for complex, bytes for unmapped dtypes.
    int64_t row = rows > 0 ? t.numel() / rows : 0;
    ncl_dtype dt;
    if (t.is_complex()) row *= 2;
    else if (!ncl_dtype_of(t.scalar_type(), &dt)) row *= static_cast<int64_t>(t.element_size());
    std::vector<int64_t> out(size_);
    if (s.empty()) {
      TORCH_CHECK(rows % size_ == 0, "all_to_all_single: the ", role, " has ", rows, " rows, not divisible by ",
                  size_, " ranks");
      for (auto& v : out) v = rows / size_ * row;
      return out;
    }
    TORCH_CHECK(s.size() == static_cast<size_t>(size_), "all_to_all_single: ", role, " split sizes have ",
                s.size(), " entries for ", size_, " ranks");
    int64_t total = 0;
    for (int r = 0; r < size_; r++) {
      TORCH_CHECK(s[r] >= 0, "all_to_all_single: negative ", role, " split size");
      total += s[r];
      out[r] = s[r] * row;
    }
    TORCH_CHECK(total == rows, "all_to_all_single: ", role, " split sizes sum to ", total, " but the ", role,
                " has ", rows, " rows");
    return out;
  }

  ncl_comm* comm_ = nullptr;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  double timeout_s_;
  bool force_gloo_;
  bool entered_ = false;  // the current call reached the C collective (which synchronises on its own)
  uint64_t seq_ = 0;
  std::string last_split_name_;
  c10::intrusive_ptr<c10d::Backend> last_split_;
  std::mutex mu_;
  std::vector<Pending> pending_;
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, std::vector<at::Tensor>>> gloo_pending_;
};

}  // namespace

void register_process_group(pybind11::module& m) {
  namespace py = pybind11;
  py::module::import("torch.distributed");
  py::class_<NeuronBackend, c10d::Backend, c10::intrusive_ptr<NeuronBackend>>(m, "_NeuronBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
                       const std::optional<c10::intrusive_ptr<c10d::Backend>>& gloo, bool force_gloo) {
             return c10::make_intrusive<NeuronBackend>(store, rank, size, timeout_s,
                                                       gloo ? *gloo : c10::intrusive_ptr<c10d::Backend>(),
                                                       force_gloo);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"), py::arg("gloo"),
           py::arg("force_gloo") = false, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("uses_shared_memory", &NeuronBackend::usesSharedMemory);
}

}  // namespace torch_neuronx
