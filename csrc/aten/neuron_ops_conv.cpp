// Native 2-D convolution for the neuron device (convolution_overrideable and its backward): im2col
// (kernels/conv.c) and one GEMM per image and group, fp32 accumulation, inputs in any strides, outputs
// in the memory format CPU gives them; 3x3 stride-1 forwards (fp32/bf16/fp16) on large enough images by
// Winograd F(4x4, 3x3) (kernels/conv_winograd.c, winograd_pays), on a transformed weight kept between calls
// (WinoCache); a stride-1 forward with at most 8 output channels directly (kernels/conv_direct.c, few_out_pays).
// Transposed, 1-D/3-D and other dtypes run PyTorch's CPU convolution on the same memory
// (neuron_convolution_overrideable).
#include "aten/neuron_aten.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <vector>
#include <array>

namespace torch_neuronx {
namespace {

bool onednn_reports(const char* op) {
  auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
  return handle.has_value() && handle->typed<bool()>().call();
}

// Whether PyTorch's CPU convolution runs dtype st on oneDNN: it does for bf16 and fp16 where the CPU has
// the instructions oneDNN's kernels need (the checks behind torch.ops.mkldnn._is_mkldnn_*_supported),
// unless the user turned oneDNN off.
bool cpu_conv_on_onednn(at::ScalarType st) {
  static const bool bf16 = onednn_reports("mkldnn::_is_mkldnn_bf16_supported");
  static const bool fp16 = onednn_reports("mkldnn::_is_mkldnn_fp16_supported");
  if (!at::globalContext().userEnabledMkldnn()) return false;
  return st == at::kBFloat16 ? bf16 : (st == at::kHalf ? fp16 : false);
}

struct Geometry;
bool im2col_pays(const Geometry& g, at::ScalarType st);

struct Geometry {
  int64_t N, C, H, W, OC, Cg, OCg, kh, kw, OH, OW, groups;
  int64_t k[2], s[2], p[2], d[2];
  bool pointwise;  // 1x1, stride 1, no padding: the image is already the column matrix
  bool winograd;   // the forward runs the Winograd kernel (kernels/conv_winograd.c)
  bool wino_if_cached;  // ... only on a transformed weight the cache serves (admitted on its second use)
  bool few_out;    // the forward runs the direct kernel for few output channels (kernels/conv_direct.c)
};

// The native kernels' speed rules were measured on SIMD micro-kernels (AVX2, AVX-512), not the portable ones.
bool simd_kernels() {
  static const bool simd = std::strcmp(nk_gemm_isa_name(), "generic") != 0;
  return simd;
}

// Whether the direct kernel for few output channels (nk_conv2d_few_out) can take the forward: stride 1, one
// group, at most 8 output channels, a kernel larger than 1x1 (a 1x1 one is a GEMM on the image itself).
bool few_out_fits(const Geometry& g) {
  return g.groups == 1 && g.OC <= 8 && g.s[0] == 1 && g.s[1] == 1 && g.kh * g.kw > 1;
}

// Whether it beats PyTorch's CPU kernel (oneDNN's, which runs few output channels at a fraction of its speed:
// 128->3 3x3 at 256x256 fp32 at 15 GFLOP/s on two threads). 2026-12-07, the 2-core Xeon (family 6 model 207,
// AVX-512), one thread, 5 alternating rounds, ms CPU/neuron, 3x3 padding 1: 128->3 at 256x256 fp32 30.5/8.1,
// bf16 31.9/7.9, fp16 50.3/8.3; 64->4 N2 at 64x64 fp32 1.30/0.52; 128->3 at 37x37 fp32 0.70/0.56 (1.25x), bf16
// 2.4x; 512->8 at 32x32 fp32 1.92/1.77 (1.08x), bf16 1.9x, fp16 2.5x; 16->3 at 256x256 fp32 2.8x. Not measured
// on AVX2.
bool few_out_pays(const Geometry& g) {
  return simd_kernels() && g.C * g.kh * g.kw >= 64 && g.N * g.OH * g.OW >= 1024;
}

// Whether the Winograd kernel can take the convolution: fp32/bf16/fp16 (bf16/fp16 computed in fp32 and rounded
// once, as CPU's oneDNN kernel does), 3x3, stride 1, dilation 1 (any padding, groups).
bool winograd_fits(const Geometry& g, at::ScalarType st) {
  return (st == at::kFloat || st == at::kBFloat16 || st == at::kHalf) && g.kh == 3 && g.kw == 3 && g.s[0] == 1 &&
         g.s[1] == 1 && g.d[0] == 1 && g.d[1] == 1;
}

// Whether F(4x4, 3x3) Winograd beats the route the convolution takes otherwise (oneDNN's direct kernel, or
// im2col + GEMM where im2col_pays). It multiplies 4x less than a direct convolution but transforms the
// weight to 4x its size on every call, a memory-bound pass that only a large enough image amortises: the
// rule is in 4x4 output tiles (all images) and in the transformed weight's size. Measured on a 2-core Zen 4
// (AVX-512 micro-kernels; oneDNN's AVX-512 kernel), one thread, ms CPU/Winograd (median of 5 alternating
// rounds, the 0, +-1, +-2 points): 512->512 at 16x16 (16 tiles) 12.8/15.6, 320->320 at 16x16 5.6/8.0, N2 640->640 at 16x16 (32 tiles)
// 36.3/26.9, N2 512->512 at 16x16 23.1/15.5, 512->512 at 24x24 (36 tiles) 26.2/23.6 (two threads 0.97-1.11x),
// at 32x32 (64 tiles) 45.0/24.5; N2 1280->1280 at 16x16 175/218 and at 32x32 1.0-1.07x (a 236 MB transformed
// weight). 64 tiles leaves a margin over the 32-36 where it starts to pay. The AVX2 micro-kernel against
// oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2) on the same CPU gave the same picture (before the weight
// transform was vectorised): 512->512 at 16x16 12.9/18.6, 640 N2 at 16x16 39.5/41, 512 at 32x32 48/32, at
// 64x64 192/88. Two-thread figures for the VAE and UNet shapes are in DEVELOPING.md (1.8-2.5x). Only measured
// with the AVX2 and AVX-512 micro-kernels, and for >= 64 channels.
// The bound of the transformed-weight cache in bytes (WinoCache): TORCH_NEURONX_WINOGRAD_CACHE_MB (default 512;
// 0: no cache), read per call (a convolution costs milliseconds) so tests can change it.
size_t wino_cache_limit() {
  const char* e = std::getenv("TORCH_NEURONX_WINOGRAD_CACHE_MB");
  const long long mb = e != nullptr && e[0] != '\0' ? std::atoll(e) : 512;
  return mb > 0 ? static_cast<size_t>(mb) << 20 : 0;
}

// With the transformed weight reused from the cache, smaller images pay too. 2026-12-07, the 2-core Zen 4, 2
// threads, 7 alternating rounds, CPU/neuron median [min-max], cached vs uncached: fp32 512->512 at 16x16 (16
// tiles) 1.63x [0.85-2.43] vs 0.70x, at 24x24 1.64x vs 0.96x, 320->320 at 16x16 1.26x vs 0.54x, N2 640->640 at
// 16x16 2.29x vs 1.10x; bf16 against oneDNN's AVX512-BF16 kernel only from 64 tiles (512->512 at 32x32 1.28x vs
// 0.83x uncached; at 16x16 0.67x, at 24x24 0.78x, 320 at 16x16 0.65x even cached). fp16 (no oneDNN fp16 on Zen
// 4: the im2col kernel otherwise) 1.6-3.2x cached from 16 tiles. So from 16 tiles where the cache is on and
// holds at least 4 such weights (a pipeline cycling through more weights than fit misses every call: 0.5-0.7x
// there), except bf16/fp16 that CPU runs on oneDNN.
// bf16/fp16 where CPU has no oneDNN kernel for them (an AVX2 CPU: cpu_conv_on_onednn false) would otherwise
// run the im2col kernel, itself slower than oneDNN's fp32 AVX2 kernel (0.42-0.75x, im2col_pays), so the fp32
// rule measured against oneDNN is conservative there; Winograd widens to fp32 just as that path's GEMM does
// (on the Zen 4, fp16, which has no oneDNN kernel there: Winograd 3.0-3.9x the im2col kernel on the VAE/UNet
// shapes above).
// A weight whose transform the cache holds fewer than 4 of (N2 1280->1280 at 16x16: 236 MB of U and a 59 MB fp32
// copy against the default 512 MB), or whose C*OC is past 640^2, pays only cached: uncached it lost (N2 1280 at
// 16x16 0.6x, a memory-bound transform per call), cached it won. Such a convolution is Winograd::if_cached: it
// takes Winograd only when the cache serves its U, and the cache admits such a weight on its second use without
// evicting entries used since that weight's previous use (WinoCache::get); otherwise its other route.
enum class Winograd { no, yes, if_cached };
Winograd winograd_pays(const Geometry& g, at::ScalarType st) {
  if (!simd_kernels() || g.groups != 1 || g.Cg < 64 || g.OCg < 64) return Winograd::no;
  const int64_t tiles = g.N * ((g.OH + 3) / 4) * ((g.OW + 3) / 4);
  const bool big = g.Cg * g.OCg > 640 * 640;
  if (!big && tiles >= 64) return Winograd::yes;
  if (tiles < 16) return Winograd::no;
  const size_t lim = wino_cache_limit(), need = nk_conv3x3_winograd_weight_bytes(g.OCg, g.Cg);
  const size_t wbytes = static_cast<size_t>(g.OCg * g.Cg * 9) * at::elementSize(st);
  const bool half_on_onednn = st != at::kFloat && cpu_conv_on_onednn(st);
  if (!big && lim >= 4 * need) return half_on_onednn ? Winograd::no : Winograd::yes;
  if (lim < need + wbytes || (half_on_onednn && !big)) return Winograd::no;
  return Winograd::if_cached;
}

// Whether the im2col + GEMM kernel should take a convolution that is not pointwise. im2col writes Cg*kh*kw
// values per output pixel and the GEMM spends 2*OCg flops on each, so with few output channels per group
// the copy costs more than the product, and PyTorch's CPU convolution (oneDNN's direct kernels, run on the
// same device memory) is faster. Measured on a 2-core Xeon (AMX), 3x3, ms neuron/CPU: fp32 64->64 at 64x64
// 10.6/6.6, 128->3 at 128x128 56/9.8, 128->128 24/17, 256->256 at 32x32 18.6/27.9, 320->320 47/48; bf16,
// where CPU's oneDNN uses AMX/AVX512-BF16, slower in every 3x3 case (0.05-0.86x) while 1x1 ran 7x faster.
// Where the CPU lacks the instructions oneDNN wants for bf16/fp16, PyTorch's CPU convolution of those dtypes
// runs reference loops: on a Zen 3 (AVX2), 3x3 bf16 64->64 at 32x32 83/6.3 ms CPU/native, 128->128 380/11.7,
// 128->3 at 64x64 92/21, 640->640 31 s/0.37 s, so every one of them takes the kernel. fp32 on that CPU runs
// oneDNN's AVX2 direct kernels, which beat im2col + GEMM (0.42-0.75x for 128 to 640 channels, 1280 even):
// only a GEMM with AVX-512 micro-kernels makes the copy pay for fp32.
// TORCH_NEURONX_CONV_NATIVE=1 takes the kernel for every convolution it can do (tests), =0 for none (read
// per call: a convolution costs milliseconds).
// The fp32 rule above (>= 256 output channels per group) was measured on that AMX Xeon, whose cores have two
// 512-bit FMA units. A Zen 4 runs AVX-512 on 256-bit units, double-pumped (its measured fp32 peak is 32
// flops/cycle/core, AVX2's); there, 2 cores, 2 threads, 7 alternating rounds, oneDNN/im2col median [min-max],
// 2026-12-07: 3x3 stride 2 256@128x128 0.65x [0.55-0.75], 512@64x64 0.80x, N2 640@32x32 0.84x, N2 640->1280 at
// 16x16 0.80x, N2 512 at 8x8 0.71x, 640 at 8x8 0.78x, 320 at 8x8 0.36x; but 1280 channels, where oneDNN's kernel
// is weight-bound on a small image: N2 at 16x16 1.03x, 12x12 1.01x, 8x8 1.67x, 4x4 3.19x, N1 at 8x8 2.72x. So
// >= 256 where the CPU has AMX (the Xeon generations it was measured on), >= 1024 on other AVX-512 CPUs.
bool im2col_pays(const Geometry& g, at::ScalarType st) {
  if (st != at::kFloat) return !cpu_conv_on_onednn(st);
  static const bool avx512 = std::strcmp(nk_gemm_isa_name(), "avx512") == 0;
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool two_fma512 = avx512 && __builtin_cpu_supports("amx-tile");
#else
  static const bool two_fma512 = false;
#endif
  return avx512 && g.OCg >= (two_fma512 ? 256 : 1024);
}

// forward: the Winograd kernel may be chosen (g->winograd); the backward has no Winograd path, so its
// route stays that of im2col_pays.
bool native_ok(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
               int64_t groups, Geometry* g, bool forward) {
  const at::ScalarType st = input.scalar_type();
  if (transposed || input.dim() != 4 || weight.dim() != 4 || groups < 1) return false;
  if (st != at::kFloat && st != at::kBFloat16 && st != at::kHalf) return false;
  if (weight.scalar_type() != st || !input.is_privateuseone() || weight.device() != input.device()) return false;
  if (bias.has_value() && bias->defined() &&
      (bias->scalar_type() != st || bias->device() != input.device() || bias->dim() != 1))
    return false;
  if (stride.size() != 2 || padding.size() != 2 || dilation.size() != 2) return false;
  *g = Geometry{};
  g->N = input.size(0), g->C = input.size(1), g->H = input.size(2), g->W = input.size(3);
  g->OC = weight.size(0), g->kh = weight.size(2), g->kw = weight.size(3), g->groups = groups;
  if (g->C % groups != 0 || g->OC % groups != 0 || weight.size(1) != g->C / groups) return false;
  if (bias.has_value() && bias->defined() && bias->size(0) != g->OC) return false;
  g->Cg = g->C / groups, g->OCg = g->OC / groups;
  for (int i = 0; i < 2; ++i) {
    g->k[i] = weight.size(2 + i), g->s[i] = stride[i], g->p[i] = padding[i], g->d[i] = dilation[i];
    if (g->s[i] <= 0 || g->p[i] < 0 || g->d[i] <= 0) return false;  // PyTorch's CPU kernel raises its error
  }
  const int64_t eh = g->H + 2 * g->p[0] - g->d[0] * (g->kh - 1) - 1, ew = g->W + 2 * g->p[1] - g->d[1] * (g->kw - 1) - 1;
  if (eh < 0 || ew < 0 || g->kh == 0 || g->kw == 0) return false;  // an empty kernel or too-small input: CPU's error
  g->OH = eh / g->s[0] + 1, g->OW = ew / g->s[1] + 1;
  g->pointwise = g->kh == 1 && g->kw == 1 && g->s[0] == 1 && g->s[1] == 1 && g->p[0] == 0 && g->p[1] == 0;
  // TORCH_NEURONX_CONV_WINOGRAD=0 keeps Winograd out (the im2col kernel then takes what native takes), =1
  // takes it for every convolution it fits, like TORCH_NEURONX_CONV_NATIVE=1 (benchmarks, tests).
  const char* wino = std::getenv("TORCH_NEURONX_CONV_WINOGRAD");
  const bool wino_set = wino != nullptr && wino[0] != '\0';
  const bool fits = forward && winograd_fits(*g, st) && !(wino_set && wino[0] == '0');
  const char* force = std::getenv("TORCH_NEURONX_CONV_NATIVE");
  if (force != nullptr && force[0] != '\0') {
    g->winograd = fits && force[0] != '0';
    g->few_out = forward && !g->winograd && force[0] != '0' && few_out_fits(*g);
    return force[0] != '0';
  }
  if (forward && few_out_fits(*g) && few_out_pays(*g)) return g->few_out = true;
  const Winograd pays = fits && !wino_set ? winograd_pays(*g, st) : Winograd::no;
  g->winograd = fits && (wino_set || pays != Winograd::no);
  g->wino_if_cached = pays == Winograd::if_cached;
  return g->pointwise || g->winograd || im2col_pays(*g, st);
}

// ---- transformed Winograd weights kept between calls ---------------------------------------------------------
// Inference runs the same convolution weights at every step, and on a small image the weight transform (4x the
// weight in fp32, a memory-bound pass) is what Winograd loses on. The cache keeps U per weight, keyed so that it
// cannot be stale: a weak reference to the weight's StorageImpl (while it lives, the StorageImpl's memory is not
// reused, so another tensor cannot take the key over; the data itself is freed with the last strong reference),
// the storage's data pointer (a reallocated storage misses), the weight's version counter (in-place updates:
// optimizer steps, load_state_dict, w.add_(1)), its offset, sizes, strides, dtype, device, and the micro-kernel
// family (U's layout). The key alone misses writes that bypass the version counter: `w.data += delta` (PEFT's
// LoRA merge, diffusers' fuse_lora) gives w.data a counter of its own, and the cached U then gave a silently
// wrong convolution. So an entry also keeps a copy of the weight's bytes, compared with the weight on every hit
// (a read of the weight, against the transform's read and 4x write of it: 512->512 fp32, 9.4 MB, ~1 ms on two
// Zen 4 threads). Only dense weights (any dim order) are cached; inference tensors have no version counter and
// are never cached. Bounded in bytes (LRU, the copy included); entries of freed weights are dropped on the next
// lookup.
// A dense weight's bytes, one span from data_ptr (any dim order: dense strides are positive).
size_t weight_bytes(const at::Tensor& w) { return static_cast<size_t>(w.numel()) * w.element_size(); }

// Whether a dense weight still holds the bytes of copy: chunks compared on the intra-op pool.
bool same_bytes(const void* copy, const at::Tensor& w) {
  const size_t n = weight_bytes(w), chunk = size_t{1} << 20;
  const char *a = static_cast<const char*>(copy), *b = static_cast<const char*>(w.const_data_ptr());
  std::atomic<bool> differ{false};
  at::parallel_for(0, static_cast<int64_t>((n + chunk - 1) / chunk), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end && !differ.load(std::memory_order_relaxed); ++i) {
      const size_t off = static_cast<size_t>(i) * chunk, len = std::min(chunk, n - off);
      if (std::memcmp(a + off, b + off, len) != 0) differ.store(true, std::memory_order_relaxed);
    }
  });
  return !differ.load();
}

struct WinoKey {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  const void* data;
  int64_t version, offset;
  std::array<int64_t, 4> sizes, strides;
  at::ScalarType dtype;
  c10::DeviceIndex device;
  const char* isa;

  explicit WinoKey(const at::Tensor& w)
      : storage(w.storage().getWeakStorageImpl()), data(w.storage().data()), version(w._version()),
        offset(w.storage_offset()), dtype(w.scalar_type()), device(w.device().index()), isa(nk_gemm_isa_name()) {
    for (int i = 0; i < 4; ++i) sizes[i] = w.size(i), strides[i] = w.stride(i);
  }
  bool same_storage(const at::Tensor& w) const {
    return !storage.expired() && storage._unsafe_get_target() == w.storage().unsafeGetStorageImpl();
  }
  bool matches(const at::Tensor& w) const {
    if (!same_storage(w) || data != w.storage().data() || version != w._version() || offset != w.storage_offset() ||
        dtype != w.scalar_type() || device != w.device().index() || isa != nk_gemm_isa_name())
      return false;
    for (int i = 0; i < 4; ++i)
      if (sizes[i] != w.size(i) || strides[i] != w.stride(i)) return false;
    return true;
  }
};

struct WinoEntry : WinoKey {
  std::shared_ptr<void> u;  // held by a running convolution too, so an eviction meanwhile cannot free it
  std::shared_ptr<void> wcopy;  // the weight's bytes when U was made (weight_bytes(w) of them)
  size_t ubytes;                // U's
  size_t bytes;                 // U's and the copy's
  uint64_t used;                // the lookup count at its last hit (or admission)

  WinoEntry(const at::Tensor& w, std::shared_ptr<void> buf, size_t n, std::shared_ptr<void> copy, uint64_t now)
      : WinoKey(w), u(std::move(buf)), wcopy(std::move(copy)), ubytes(n), bytes(n + weight_bytes(w)), used(now) {}
};

// A weight seen by a lookup that did not admit it (WinoCache::get's second-use admission): its key and when.
struct WinoSeen : WinoKey {
  uint64_t seen;
  WinoSeen(const at::Tensor& w, uint64_t now) : WinoKey(w), seen(now) {}
};

class WinoCache {
 public:
  static size_t limit() { return wino_cache_limit(); }

  // U for weight w [OC, C, 3, 3] (its transform kept if it fits the bound), or null where w is not cached.
  // second_use: w is admitted only on a lookup after one that saw it (a one-off weight transforms nothing and
  // evicts nothing), and only where its room comes from entries unused since that previous lookup of w: a
  // pipeline cycling through more such weights than fit keeps the ones admitted first (hits every cycle) and
  // runs the others on their other route, where plain LRU would evict each before its next use (all misses).
  // A null return then means: not cached, take the other route.
  std::shared_ptr<void> get(const at::Tensor& w, size_t* bytes, const char* op, bool second_use = false) {
    const size_t lim = limit(), need = nk_conv3x3_winograd_weight_bytes(w.size(0), w.size(1));
    const size_t wbytes = weight_bytes(w);
    *bytes = need;
    std::shared_ptr<void> recycled;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const uint64_t now = ++lookups_;
      if (lim == 0 || need + wbytes > lim || w.is_inference() || !w.has_storage() ||
          !w.is_non_overlapping_and_dense()) {
        sweep(at::Tensor());
        shrink(lim, nullptr, 0);
        return nullptr;
      }
      sweep(w);
      for (auto it = lru_.begin(); it != lru_.end(); ++it)
        if (it->matches(w)) {
          lru_.splice(lru_.begin(), lru_, it);
          std::shared_ptr<void> u = it->u, copy = it->wcopy;  // kept alive while unlocked
          lock.unlock();
          const bool same = same_bytes(copy.get(), w);
          lock.lock();
          for (auto jt = lru_.begin(); jt != lru_.end(); ++jt)
            if (jt->u == u) {
              if (same) jt->used = now;
              else erase(jt);  // written behind the version counter: the entry is stale
              break;
            }
          if (same) {
            ++hits_;
            return u;
          }
          break;
        }
      if (second_use && !admits(w, now, lim - need - wbytes)) return nullptr;
      // Room for the new entry; an evicted buffer of the same size is reused: a pipeline whose weights exceed
      // the bound then misses every call, and fresh pages for a 38 MB U cost ~10% of a large convolution.
      shrink(lim - need - wbytes, &recycled, need);
    }
    if (!recycled) {
      void* p = std::aligned_alloc(64, (need + 63) & ~static_cast<size_t>(63));
      TORCH_CHECK(p != nullptr, op, ": out of host memory for a transformed weight of ", need, " bytes");
      recycled = std::shared_ptr<void>(p, std::free);
    }
    nk_tensor wd = nk_desc(w, op);
    const nk_status st = nk_conv3x3_winograd_weight(recycled.get(), need, &wd);
    if (st != NK_SUCCESS) raise_kernel_status(st, op, w);
    void* c = std::malloc(wbytes > 0 ? wbytes : 1);
    TORCH_CHECK(c != nullptr, op, ": out of host memory for a copy of a weight of ", wbytes, " bytes");
    std::shared_ptr<void> copy(c, std::free);
    std::memcpy(c, w.const_data_ptr(), wbytes);
    std::lock_guard<std::mutex> lock(mu_);
    ++misses_;
    lru_.emplace_front(w, recycled, need, copy, lookups_);
    total_ += lru_.front().bytes;
    shrink(lim, nullptr, 0);  // another thread may have inserted meanwhile
    return recycled;
  }

  std::vector<int64_t> info() {
    std::lock_guard<std::mutex> lock(mu_);
    sweep(at::Tensor());
    return {static_cast<int64_t>(lru_.size()), static_cast<int64_t>(total_), hits_, misses_};
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    lru_.clear();
    seen_.clear();
    total_ = 0;
  }

 private:
  // Second-use admission of w (lock held): whether w was seen before (else it is remembered, the oldest of
  // kSeen such weights forgotten) and the entries evicted to bring total_ to room were all unused since.
  bool admits(const at::Tensor& w, uint64_t now, size_t room) {
    constexpr size_t kSeen = 64;
    uint64_t prev = 0;
    bool found = false;
    for (auto it = seen_.begin(); it != seen_.end();) {
      auto next = std::next(it);
      if (it->storage.expired()) {
        seen_.erase(it);
      } else if (!found && it->matches(w)) {
        found = true, prev = it->seen, it->seen = now;
        seen_.splice(seen_.begin(), seen_, it);
      }
      it = next;
    }
    if (!found) {
      seen_.emplace_front(w, now);
      if (seen_.size() > kSeen) seen_.pop_back();
      return false;
    }
    size_t total = total_;
    for (auto it = lru_.rbegin(); it != lru_.rend() && total > room; ++it) {
      if (it->used > prev) return false;  // used since w's previous lookup: at least as hot as w
      total -= it->bytes;
    }
    for (auto it = seen_.begin(); it != seen_.end(); ++it)
      if (it->seen == now) {
        seen_.erase(it);  // admitted: the entry takes over
        break;
      }
    return true;
  }

  void erase(std::list<WinoEntry>::iterator it) {
    total_ -= it->bytes;
    lru_.erase(it);
  }
  // Drops entries of freed weights, and those of w's own storage and offset that no longer match it (an older
  // version of it: never looked up again); w undefined: only the freed.
  void sweep(const at::Tensor& w) {
    for (auto it = lru_.begin(); it != lru_.end();) {
      auto next = std::next(it);
      if (it->storage.expired() ||
          (w.defined() && it->same_storage(w) && it->offset == w.storage_offset() && !it->matches(w)))
        erase(it);
      it = next;
    }
  }
  // Evicts least recently used entries until total_ <= room; the first evicted buffer of `want` bytes that no
  // running convolution holds goes to *keep.
  void shrink(size_t room, std::shared_ptr<void>* keep, size_t want) {
    while (total_ > room && !lru_.empty()) {
      auto last = std::prev(lru_.end());
      if (keep != nullptr && !*keep && last->ubytes == want && last->u.use_count() == 1) *keep = last->u;
      erase(last);
    }
  }

  std::mutex mu_;
  std::list<WinoEntry> lru_;  // most recently used first
  std::list<WinoSeen> seen_;  // weights a second-use lookup saw but did not admit, most recent first
  uint64_t lookups_ = 0;
  size_t total_ = 0;
  int64_t hits_ = 0, misses_ = 0;
};

WinoCache& wino_cache() {
  static WinoCache* c = new WinoCache();  // never destroyed: convolutions may run during interpreter exit
  return *c;
}

// t as a [rows, cols] matrix view (no copy): valid when the merged dims are contiguous among themselves.
nk_tensor matrix(const at::Tensor& t, int64_t rows, int64_t cols, const char* op) {
  at::Tensor v = t.view({rows, cols});
  return nk_desc(v, op);
}

void check(nk_status s, const char* op, const at::Tensor& t) {
  if (s != NK_SUCCESS) raise_kernel_status(s, op, t);
}

void gemm(const nk_tensor& out, const nk_tensor& a, const nk_tensor& b, const nk_tensor* self, double beta,
          const char* op, const at::Tensor& t) {
  check(nk_gemm(&out, &a, &b, self, 1.0, beta), op, t);
}

nk_tensor transposed(nk_tensor t) {
  std::swap(t.sizes[0], t.sizes[1]);
  std::swap(t.strides[0], t.strides[1]);
  return t;
}

// Whether a [C, H, W] image is a [C, H*W] matrix without a copy (any strides: channels-last and permuted
// images too), as the pointwise path needs.
bool merges_hw(const at::Tensor& img) {
  return img.size(1) <= 1 || img.size(2) <= 1 || img.stride(1) == img.stride(2) * img.size(2);
}

// The image as that [C, H*W] matrix (merges_hw holds).
nk_tensor hw_matrix(const at::Tensor& img, const char* op) {
  nk_tensor m = nk_desc(img, op);
  const int64_t h = img.size(1), w = img.size(2);
  m.ndim = 2;
  m.strides[1] = w <= 1 ? m.strides[1] : m.strides[2];  // H*W steps of W's stride (or H's when W is 1)
  m.sizes[1] = h * w;
  return m;
}

// A batch of such images, [N, C, H, W], as [N, C, H*W] (merges_hw holds for image 0, hence for all).
nk_tensor batch_hw_matrix(const at::Tensor& t, const char* op) {
  nk_tensor m = nk_desc(t, op);
  const int64_t h = t.size(2), w = t.size(3);
  m.ndim = 3;
  m.strides[2] = w <= 1 ? m.strides[2] : m.strides[3];
  m.sizes[2] = h * w;
  return m;
}

// A [rows, cols] descriptor repeated n times with batch stride 0: [n, rows, cols].
nk_tensor repeated(nk_tensor t, int64_t n) {
  for (int d = t.ndim; d > 0; --d) {
    t.sizes[d] = t.sizes[d - 1];
    t.strides[d] = t.strides[d - 1];
  }
  t.sizes[0] = n;
  t.strides[0] = 0;
  t.ndim += 1;
  return t;
}

// Whether every image of the input is a matrix for the pointwise path; otherwise columns() needs a col buffer.
bool pointwise_views(const at::Tensor& input, const Geometry& g) {
  return g.pointwise && (g.N == 0 || merges_hw(input[0]));  // all images share the strides of image 0
}

// The input image n, group g as [Cg*kh*kw, OH*OW] columns: a view when pointwise, else im2col into col.
nk_tensor columns(const at::Tensor& input, const Geometry& g, int64_t n, int64_t grp, const at::Tensor& col,
                  const char* op) {
  at::Tensor img = input[n].narrow(0, grp * g.Cg, g.Cg);
  if (g.pointwise && merges_hw(img)) return hw_matrix(img, op);
  TORCH_INTERNAL_ASSERT(col.defined(), op, ": no column buffer for an input of strides ", input.strides());
  nk_tensor c = nk_desc(col, op), i = nk_desc(img, op);
  check(nk_im2col(&c, &i, g.k, g.s, g.p, g.d), op, input);
  return c;
}

// The memory format PyTorch's CPU convolution gives its output: channels-last when the input or the
// weight is (a 1x1 weight is ambiguous and counts as contiguous).
at::MemoryFormat output_format(const at::Tensor& input, const at::Tensor& weight) {
  const bool cl = input.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
                  weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  return cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

// Whether converting the operands (and the output back) costs less than CPU's conversion of its output: the
// output must not be much smaller than the input, nor the weight over twice the input (a 1280-channel 3x3
// weight of a 16x16 image took 4.9 ms to convert, its convolution 10 ms). Measured, 3x3 bf16, ms CPU/neuron:
// 128->128 at 256x256 51.5/14.7, 512->512 at 64x64 16.1/9.7, N2 320->320 at 64x64 7.0/7.0; declined:
// 128->3 at 256x256 (4.4/4.7), N2 1280->1280 at 16x16 (13.1/15.3).
bool handoff_pays(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                  at::IntArrayRef padding, at::IntArrayRef dilation) {
  if (stride.size() != 2 || padding.size() != 2 || dilation.size() != 2 || weight.numel() > 2 * input.numel())
    return false;
  int64_t out = input.size(0) * weight.size(0);
  for (int i = 0; i < 2; ++i) {
    const int64_t extent = input.size(2 + i) + 2 * padding[i] - dilation[i] * (weight.size(2 + i) - 1) - 1;
    if (extent < 0 || stride[i] <= 0) return false;
    out *= extent / stride[i] + 1;
  }
  return 4 * out >= input.numel();
}

// The forward on PyTorch's CPU convolution (the device memory aliased), for what the native kernels decline.
at::Tensor conv_forward_cpu(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                            bool transposed_, at::IntArrayRef output_padding, int64_t groups) {
  {
    // PyTorch's CPU convolution on oneDNN (bf16/fp16) computes a contiguous input's output in channels-last
    // and converts it with the CPU's strided copy (16 ms of a [1,128,256,256] bf16 VAE convolution's time).
    // Handing it channels-last operands, converted by the device's copy kernel, leaves it nothing to convert
    // (oneDNN computes in that layout either way, so the values are the same); the output goes back to the
    // contiguous format CPU returns the same way.
    if (!transposed_ && input.dim() == 4 && weight.dim() == 4 && input.is_privateuseone() &&
        weight.is_privateuseone() && cpu_conv_on_onednn(input.scalar_type()) &&
        weight.scalar_type() == input.scalar_type() &&
        output_format(input, weight) == at::MemoryFormat::Contiguous && input.numel() >= 4096 &&
        handoff_pays(input, weight, stride, padding, dilation)) {
      const auto cl = at::MemoryFormat::ChannelsLast;
      at::Tensor out = neuron_convolution_overrideable(input.contiguous(cl), weight.contiguous(cl), bias, stride,
                                                       padding, dilation, transposed_, output_padding, groups);
      return out.contiguous();
    }
    return neuron_convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed_,
                                           output_padding, groups);
  }
}

at::Tensor conv_forward(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed_,
                        at::IntArrayRef output_padding, int64_t groups) {
  Geometry g;
  if (!native_ok(input, weight, bias, stride, padding, dilation, transposed_, groups, &g, true))
    return conv_forward_cpu(input, weight, bias, stride, padding, dilation, transposed_, output_padding, groups);
  const char* op = "convolution";
  std::shared_ptr<void> u_if_cached;  // a Winograd::if_cached convolution's U (groups == 1)
  size_t u_bytes = 0;
  if (g.winograd && g.wino_if_cached) {
    u_if_cached = wino_cache().get(weight, &u_bytes, op, /*second_use=*/true);
    if (!u_if_cached) {  // not cached (yet): the route it takes without Winograd
      g.winograd = false;
      if (!g.pointwise && !im2col_pays(g, input.scalar_type()))
        return conv_forward_cpu(input, weight, bias, stride, padding, dilation, transposed_, output_padding, groups);
    }
  }
  NEURON_NATIVE("aten::convolution_overrideable");
  at::Tensor out = at::empty({g.N, g.OC, g.OH, g.OW}, input.options(), output_format(input, weight));
  if (out.numel() == 0) return out;
  if (g.C == 0 || g.kh * g.kw == 0) {  // an empty reduction: the bias alone (or zeros)
    if (bias.has_value() && bias->defined()) out.copy_(bias->view({1, g.OC, 1, 1}).expand_as(out));
    else out.zero_();
    return out;
  }
  const bool has_bias = bias.has_value() && bias->defined();
  if (g.few_out) {  // any strides in and out: no copies
    nk_tensor o = nk_desc(out, op), x = nk_desc(input, op), w = nk_desc(weight, op), b{};
    if (has_bias) b = nk_desc(*bias, op);
    check(nk_conv2d_few_out(&o, &x, &w, has_bias ? &b : nullptr, g.p, g.d), op, input);
    return out;
  }
  if (g.winograd) {
    // Reads the input, weight and bias through their strides and writes out's layout: no copies.
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      at::Tensor xi = g.groups == 1 ? input : input.narrow(1, grp * g.Cg, g.Cg);
      at::Tensor wi = g.groups == 1 ? weight : weight.narrow(0, grp * g.OCg, g.OCg);
      at::Tensor oi = g.groups == 1 ? out : out.narrow(1, grp * g.OCg, g.OCg);
      nk_tensor o = nk_desc(oi, op), x = nk_desc(xi, op), b{};
      if (has_bias) b = nk_desc(g.groups == 1 ? *bias : bias->narrow(0, grp * g.OCg, g.OCg), op);
      size_t ubytes = u_bytes;
      std::shared_ptr<void> u = u_if_cached ? u_if_cached : wino_cache().get(wi, &ubytes, op);
      if (u) {
        check(nk_conv3x3_winograd_pretransformed(&o, &x, u.get(), ubytes, has_bias ? &b : nullptr, g.p), op, input);
      } else {  // not cached: the one-call form transforms into the thread's kept scratch
        nk_tensor w = nk_desc(wi, op);
        check(nk_conv3x3_winograd(&o, &x, &w, has_bias ? &b : nullptr, g.p), op, input);
      }
    }
    return out;
  }
  at::Tensor w = weight.contiguous();
  at::Tensor col = pointwise_views(input, g) ? at::Tensor()
                                             : at::empty({g.Cg * g.kh * g.kw, g.OH * g.OW}, input.options());
  if (g.groups == 1 && g.N > 1 && !col.defined()) {
    // A pointwise convolution of several images is one batched product, [N, OC, C] (the weight, batch
    // stride 0) x [N, C, H*W]: the pool's threads take whole images, so each packs the weight once per
    // image, where one product per image split every image's columns among them and each packed all of it.
    nk_tensor o = batch_hw_matrix(out, op), x = batch_hw_matrix(input, op);
    nk_tensor wb = repeated(matrix(w, g.OC, g.C, op), g.N);
    if (has_bias) {
      nk_tensor b = repeated(nk_desc(*bias, op), g.N);  // [N, OC] -> [N, OC, OH*OW], stride 0 but along OC
      b.ndim = 3, b.sizes[2] = g.OH * g.OW, b.strides[2] = 0;
      gemm(o, wb, x, &b, 1.0, op, input);
    } else {
      gemm(o, wb, x, nullptr, 0.0, op, input);
    }
    return out;
  }
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      nk_tensor c = columns(input, g, n, grp, col, op);
      nk_tensor wg = matrix(w.narrow(0, grp * g.OCg, g.OCg), g.OCg, g.Cg * g.kh * g.kw, op);
      nk_tensor o = matrix(out[n].narrow(0, grp * g.OCg, g.OCg), g.OCg, g.OH * g.OW, op);
      if (has_bias) {
        nk_tensor b = nk_desc(bias->narrow(0, grp * g.OCg, g.OCg), op);  // [OCg] -> [OCg, OH*OW], column stride 0
        b.ndim = 2, b.sizes[1] = g.OH * g.OW, b.strides[1] = 0;
        gemm(o, wg, c, &b, 1.0, op, input);
      } else {
        gemm(o, wg, c, nullptr, 0.0, op, input);
      }
    }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed_, at::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> mask) {
  Geometry g;
  if (!native_ok(input, weight, std::nullopt, stride, padding, dilation, transposed_, groups, &g, false) ||
      grad_output.scalar_type() != input.scalar_type() || grad_output.device() != input.device() ||
      grad_output.dim() != 4 || grad_output.size(0) != g.N || grad_output.size(1) != g.OC ||
      grad_output.size(2) != g.OH || grad_output.size(3) != g.OW || input.numel() == 0 || grad_output.numel() == 0)
    return neuron_convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation,
                                                    transposed_, output_padding, groups, mask);
  NEURON_NATIVE("aten::convolution_backward_overrideable");
  const char* op = "convolution_backward";
  const int64_t K = g.Cg * g.kh * g.kw, P = g.OH * g.OW;
  at::Tensor go = grad_output.contiguous();
  at::Tensor w = weight.contiguous();
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    // Where PyTorch's CPU runs the dtype on oneDNN, that forms the input gradient in fp32 and rounds once,
    // so the column gradient and col2im's sums stay fp32 here and the image is rounded at the end.
    // Elsewhere it runs its im2col kernel: the column in bf16/fp16 and col2im rounding after each tap.
    const bool widen = !g.pointwise && cpu_conv_on_onednn(input.scalar_type());
    at::Tensor wk = widen ? w.to(at::kFloat) : w, gk = widen ? go.to(at::kFloat) : go;
    at::Tensor col = g.pointwise ? at::Tensor() : at::empty({K, P}, gk.options());
    // In the layout CPU gives it (the pointwise GEMM writes it through a [Cg, H*W] view, col2im through
    // any strides); either writes every element.
    gi = at::empty(input.sizes(), widen ? input.options().dtype(at::kFloat) : input.options(),
                   output_format(input, weight));
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        nk_tensor wt = transposed(matrix(wk.narrow(0, grp * g.OCg, g.OCg), g.OCg, K, op));  // [K, OCg]
        nk_tensor gog = matrix(gk[n].narrow(0, grp * g.OCg, g.OCg), g.OCg, P, op);
        at::Tensor gin = gi[n].narrow(0, grp * g.Cg, g.Cg);
        if (g.pointwise) {
          gemm(hw_matrix(gin, op), wt, gog, nullptr, 0.0, op, input);
          continue;
        }
        nk_tensor c = nk_desc(col, op), img = nk_desc(gin, op);
        gemm(c, wt, gog, nullptr, 0.0, op, input);
        check(nk_col2im(&img, &c, g.k, g.s, g.p, g.d), op, input);
      }
    if (widen) gi = gi.to(input.scalar_type());
  }
  if (mask[1]) {
    // Where PyTorch's CPU runs the dtype on oneDNN, the batch sum is accumulated in fp32 and rounded once:
    // one product per group over all images (k = N*OH*OW). Its im2col kernel instead adds each image's
    // product into the bf16/fp16 gradient, rounding after every image: one product per image then.
    const bool per_image = input.scalar_type() != at::kFloat && !cpu_conv_on_onednn(input.scalar_type());
    gw = at::empty(w.sizes(), w.options());
    at::Tensor cols = at::empty({K, g.N * P}, input.options());  // image n in columns [n*P, (n+1)*P)
    // grad_output as [OC, N*P]: one copy, so a group's rows are one matrix with unit column stride.
    at::Tensor go_t = go.view({g.N, g.OC, P}).permute({1, 0, 2}).contiguous().view({g.OC, g.N * P});
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      for (int64_t n = 0; n < g.N; ++n) {
        nk_tensor c = nk_desc(cols.narrow(1, n * P, P), op), i = nk_desc(input[n].narrow(0, grp * g.Cg, g.Cg), op);
        check(nk_im2col(&c, &i, g.k, g.s, g.p, g.d), op, input);
      }
      at::Tensor go_g = go_t.narrow(0, grp * g.OCg, g.OCg);
      nk_tensor o = matrix(gw.narrow(0, grp * g.OCg, g.OCg), g.OCg, K, op);
      if (!per_image) {
        gemm(o, nk_desc(go_g, op), transposed(nk_desc(cols, op)), nullptr, 0.0, op, input);  // [OCg, N*P] x [N*P, K]
        continue;
      }
      for (int64_t n = 0; n < g.N; ++n)
        gemm(o, nk_desc(go_g.narrow(1, n * P, P), op), transposed(nk_desc(cols.narrow(1, n * P, P), op)), &o,
             n == 0 ? 0.0 : 1.0, op, input);
    }
  }
  if (mask[2]) gb = go.sum({0, 2, 3});
  return {gi, gw, gb};
}

}  // namespace

// (entries, bytes, hits, misses) of the transformed-weight cache, after dropping freed weights' entries; clear.
std::vector<int64_t> winograd_cache_info() { return wino_cache().info(); }
void winograd_cache_clear() { wino_cache().clear(); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(conv_forward));
  m.impl("convolution_backward_overrideable", TORCH_FN(conv_backward));
}

}  // namespace torch_neuronx
