// The fused LSTM and GRU cells on neuron (kernels/rnn.c). PyTorch's recurrent modules send every non-CPU
// device through _thnn_fused_lstm_cell / _thnn_fused_gru_cell, which have no CPU kernel the fallback
// could run: without these, nn.LSTM, nn.GRU and their cells raised NotImplementedError on neuron.
#include "aten/neuron_aten.h"

#include <torch/library.h>

namespace torch_neuronx {
namespace {

const nk_tensor* opt(const std::optional<at::Tensor>& t, nk_tensor* storage, const char* op) {
  if (!t.has_value() || !t->defined()) return nullptr;
  *storage = nk_desc(*t, op);
  return storage;
}

void check_cell(const char* op, const at::Tensor& ig, const at::Tensor& hg, const at::Tensor& state, int64_t gates,
                const std::optional<at::Tensor>& bi, const std::optional<at::Tensor>& bh) {
  TORCH_CHECK(ig.dim() == 2 && hg.dim() == 2 && state.dim() == 2, op,
              ": expected 2-D input_gates, hidden_gates and state, got ", ig.sizes(), ", ", hg.sizes(), ", ",
              state.sizes());
  const int64_t B = state.size(0), H = state.size(1);
  TORCH_CHECK(ig.sizes() == hg.sizes() && ig.size(0) == B && ig.size(1) == gates * H, op,
              ": input_gates ", ig.sizes(), " and hidden_gates ", hg.sizes(), " must both be [", B, ", ", gates * H,
              "] for a state of ", state.sizes());
  TORCH_CHECK(ig.scalar_type() == hg.scalar_type() && ig.scalar_type() == state.scalar_type(), op,
              ": expected one dtype, got ", ig.scalar_type(), ", ", hg.scalar_type(), ", ", state.scalar_type());
  for (const auto* b : {&bi, &bh})
    if (b->has_value() && (*b)->defined())
      TORCH_CHECK((*b)->dim() == 1 && (*b)->size(0) == gates * H && (*b)->scalar_type() == ig.scalar_type(), op,
                  ": a bias must be [", gates * H, "] of ", ig.scalar_type(), ", got ", (*b)->sizes(), " ",
                  (*b)->scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(const at::Tensor& ig, const at::Tensor& hg,
                                                         const at::Tensor& cx, const std::optional<at::Tensor>& bi,
                                                         const std::optional<at::Tensor>& bh) {
  NEURON_NATIVE("aten::_thnn_fused_lstm_cell");
  const char* op = "_thnn_fused_lstm_cell";
  check_cell(op, ig, hg, cx, 4, bi, bh);
  at::Tensor hy = at::empty(cx.sizes(), cx.options()), cy = at::empty(cx.sizes(), cx.options());
  at::Tensor ws = at::empty(ig.sizes(), ig.options());
  nk_tensor dhy = nk_desc(hy, op), dcy = nk_desc(cy, op), dws = nk_desc(ws, op), dig = nk_desc(ig, op), dhg = nk_desc(hg, op);
  nk_tensor dcx = nk_desc(cx, op), sbi, sbh;
  nk_status s = nk_lstm_cell(&dhy, &dcy, &dws, &dig, &dhg, &dcx, opt(bi, &sbi, op), opt(bh, &sbh, op));
  if (s != NK_SUCCESS) raise_kernel_status(s, op, ig);
  return {hy, cy, ws};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                  const std::optional<at::Tensor>& grad_cy,
                                                                  const at::Tensor& cx, const at::Tensor& cy,
                                                                  const at::Tensor& ws, bool has_bias) {
  NEURON_NATIVE("aten::_thnn_fused_lstm_cell_backward_impl");
  const char* op = "_thnn_fused_lstm_cell_backward";
  const bool any = (grad_hy.has_value() && grad_hy->defined()) || (grad_cy.has_value() && grad_cy->defined());
  if (!any) return {at::Tensor(), at::Tensor(), at::Tensor()};  // as CUDA: no gradient flows
  at::Tensor gg = at::empty(ws.sizes(), ws.options()), gcx = at::empty(cx.sizes(), cx.options());
  nk_tensor dgg = nk_desc(gg, op), dgcx = nk_desc(gcx, op), dcx = nk_desc(cx, op), dcy = nk_desc(cy, op), dws = nk_desc(ws, op);
  nk_tensor sh, sc;
  nk_status s = nk_lstm_cell_backward(&dgg, &dgcx, opt(grad_hy, &sh, op), opt(grad_cy, &sc, op), &dcx, &dcy, &dws);
  if (s != NK_SUCCESS) raise_kernel_status(s, op, cx);
  return {gg, gcx, has_bias ? gg.sum(0) : at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& ig, const at::Tensor& hg, const at::Tensor& hx,
                                            const std::optional<at::Tensor>& bi,
                                            const std::optional<at::Tensor>& bh) {
  NEURON_NATIVE("aten::_thnn_fused_gru_cell");
  const char* op = "_thnn_fused_gru_cell";
  check_cell(op, ig, hg, hx, 3, bi, bh);
  at::Tensor hy = at::empty(hx.sizes(), hx.options());
  at::Tensor ws = at::empty({hx.size(0), 5 * hx.size(1)}, hx.options());
  nk_tensor dhy = nk_desc(hy, op), dws = nk_desc(ws, op), dig = nk_desc(ig, op), dhg = nk_desc(hg, op), dhx = nk_desc(hx, op);
  nk_tensor sbi, sbh;
  nk_status s = nk_gru_cell(&dhy, &dws, &dig, &dhg, &dhx, opt(bi, &sbi, op), opt(bh, &sbh, op));
  if (s != NK_SUCCESS) raise_kernel_status(s, op, ig);
  return {hy, ws};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(const at::Tensor& grad_hy,
                                                                                         const at::Tensor& ws,
                                                                                         bool has_bias) {
  NEURON_NATIVE("aten::_thnn_fused_gru_cell_backward");
  const char* op = "_thnn_fused_gru_cell_backward";
  TORCH_CHECK(grad_hy.dim() == 2 && ws.dim() == 2 && ws.size(0) == grad_hy.size(0) &&
                  ws.size(1) == 5 * grad_hy.size(1),
              op, ": grad_hy ", grad_hy.sizes(), " does not match the workspace ", ws.sizes());
  const int64_t B = grad_hy.size(0), H = grad_hy.size(1);
  at::Tensor gig = at::empty({B, 3 * H}, grad_hy.options()), ghg = at::empty({B, 3 * H}, grad_hy.options());
  at::Tensor ghx = at::empty({B, H}, grad_hy.options());
  nk_tensor a = nk_desc(gig, op), b = nk_desc(ghg, op), c = nk_desc(ghx, op), d = nk_desc(grad_hy, op), e = nk_desc(ws, op);
  nk_status s = nk_gru_cell_backward(&a, &b, &c, &d, &e);
  if (s != NK_SUCCESS) raise_kernel_status(s, op, grad_hy);
  if (!has_bias) return {gig, ghg, ghx, at::Tensor(), at::Tensor()};
  return {gig, ghg, ghx, gig.sum(0), ghg.sum(0)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gru_cell_backward));
}

}  // namespace torch_neuronx
