"""Streams and events through torch.neuron, torch.Stream/torch.Event and torch.accelerator."""
import torch


def test_streams():
    s0 = torch.neuron.current_stream()
    assert s0 == torch.neuron.default_stream() and s0.device == torch.device("neuron:0")
    s = torch.neuron.Stream(priority=-1)
    assert s != s0 and s.query()
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        x = torch.ones(100, device="neuron") * 2
    assert torch.neuron.current_stream() == s0
    s0.wait_stream(s)
    s.synchronize()
    assert x.sum().item() == 200
    with torch.Stream(device="neuron") as ts:
        assert torch.accelerator.current_stream() == ts
    hi = torch.Stream(device="neuron:1", priority=-1)
    assert hi.device_index == 1


def test_events():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    assert start.query()  # never recorded
    start.record()
    y = torch.randn(256, 256, device="neuron") @ torch.randn(256, 256, device="neuron")
    end.record()
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) >= 0
    e = torch.Event(device="neuron")
    e.record(torch.neuron.current_stream())
    torch.neuron.current_stream().wait_event(e)
    e.synchronize()
    assert y.shape == (256, 256)
    ev = torch.neuron.current_stream().record_event()
    ev.wait()
