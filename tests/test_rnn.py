"""Recurrent networks on neuron against PyTorch CPU: nn.LSTM / nn.GRU (layers, bidirectional, batch_first,
projections, packed sequences), nn.LSTMCell / nn.GRUCell, with and without biases, in float32 and bfloat16,
forward and every gradient. PyTorch runs them through the fused cells (_thnn_fused_*_cell) on any non-CPU
device, which have native kernels here (kernels/rnn.c)."""
import copy

import pytest
import torch
import torch.nn as nn

import torch_neuronx

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=4e-2, atol=4e-2)}

MODULES = {
    "lstm": (lambda: nn.LSTM(6, 5), (4, 3, 6)),
    "lstm_2layer_bidir": (lambda: nn.LSTM(6, 5, num_layers=2, bidirectional=True), (4, 3, 6)),
    "lstm_batch_first_proj": (lambda: nn.LSTM(6, 5, batch_first=True, proj_size=3), (3, 4, 6)),
    "lstm_no_bias": (lambda: nn.LSTM(6, 5, bias=False), (4, 3, 6)),
    "lstm_unbatched": (lambda: nn.LSTM(6, 5), (4, 6)),
    "gru": (lambda: nn.GRU(6, 5), (4, 3, 6)),
    "gru_2layer_bidir_batch_first": (lambda: nn.GRU(6, 5, num_layers=2, bidirectional=True, batch_first=True), (3, 4, 6)),
    "gru_no_bias": (lambda: nn.GRU(6, 5, bias=False), (4, 3, 6)),
    "lstm_cell": (lambda: nn.LSTMCell(6, 5), (3, 6)),
    "lstm_cell_unbatched": (lambda: nn.LSTMCell(6, 5), (6,)),
    "gru_cell": (lambda: nn.GRUCell(6, 5), (3, 6)),
    "gru_cell_no_bias": (lambda: nn.GRUCell(6, 5, bias=False), (3, 6)),
}


def first(y):
    return y[0] if isinstance(y, tuple) else y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(MODULES))
def test_rnn_module_matches_cpu(name, dtype):
    make, shape = MODULES[name]
    torch.manual_seed(0)
    m = make().to(dtype)
    mn = copy.deepcopy(m).to("neuron")
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    xn = x.detach().to("neuron").requires_grad_()
    before = torch_neuronx.op_counts()
    y, yn = first(m(x)), first(mn(xn))
    after = torch_neuronx.op_counts()
    cell = "aten::_thnn_fused_gru_cell" if "gru" in name else "aten::_thnn_fused_lstm_cell"
    assert after.get(cell, {}).get("native", 0) > before.get(cell, {}).get("native", 0)
    torch.testing.assert_close(yn.cpu(), y, **TOL[dtype])
    g = torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(dtype)
    y.backward(g)
    yn.backward(g.to("neuron"))
    torch.testing.assert_close(xn.grad.cpu(), x.grad, **TOL[dtype])
    for (pname, p), pn in zip(m.named_parameters(), mn.parameters()):
        torch.testing.assert_close(pn.grad.cpu(), p.grad, **TOL[dtype], msg=lambda s: f"{pname}: {s}")


def test_initial_states_and_their_gradients():
    torch.manual_seed(1)
    m = nn.LSTM(4, 3, num_layers=2)
    mn = copy.deepcopy(m).to("neuron")
    x, h0, c0 = torch.randn(5, 2, 4), torch.randn(2, 2, 3), torch.randn(2, 2, 3)
    cpu = [t.clone().requires_grad_() for t in (x, h0, c0)]
    dev = [t.to("neuron").requires_grad_() for t in (x, h0, c0)]
    out, (h, c) = m(cpu[0], (cpu[1], cpu[2]))
    outn, (hn, cn) = mn(dev[0], (dev[1], dev[2]))
    (out.sum() + h.pow(2).sum() + c.sum()).backward()
    (outn.sum() + hn.pow(2).sum() + cn.sum()).backward()
    for a, b in zip(dev, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad, **TOL[torch.float32])


def test_packed_sequence():
    torch.manual_seed(2)
    m = nn.GRU(4, 3, batch_first=True)
    mn = copy.deepcopy(m).to("neuron")
    x, lengths = torch.randn(3, 6, 4), torch.tensor([6, 4, 2])
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
    packed_n = nn.utils.rnn.pack_padded_sequence(x.to("neuron"), lengths, batch_first=True)
    out, _ = nn.utils.rnn.pad_packed_sequence(m(packed)[0], batch_first=True)
    outn, _ = nn.utils.rnn.pad_packed_sequence(mn(packed_n)[0], batch_first=True)
    torch.testing.assert_close(outn.cpu(), out, **TOL[torch.float32])


def test_fused_cell_errors_name_the_shapes():
    ig = torch.randn(2, 8, device="neuron")
    with pytest.raises(RuntimeError, match=r"_thnn_fused_lstm_cell: input_gates \[2, 8\].*\[2, 12\]"):
        torch.ops.aten._thnn_fused_lstm_cell(ig, ig, torch.randn(2, 3, device="neuron"))
    with pytest.raises(RuntimeError, match="a bias must be"):
        torch.ops.aten._thnn_fused_gru_cell(torch.randn(2, 6, device="neuron"), torch.randn(2, 6, device="neuron"),
                                   torch.randn(2, 2, device="neuron"), torch.randn(5, device="neuron"))
