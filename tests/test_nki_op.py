"""torch_neuronx.nki_op: NKI kernels as torch.library custom ops (eager, torch.compile fullgraph, autograd, errors)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
import torch_neuronx

DEV = "neuron"


# ----------------------------------------------------------------------------------------------- kernels
@nki.jit
def scale_rows(x, s=2.0):
    """out = x * s; program i handles rows [128 i, 128 i + 128)."""
    R, C = x.shape
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    p = min(128, R - i * 128)
    t = nl.ndarray((128, C), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:p], src=x[i * 128:i * 128 + p, :])
    nisa.tensor_scalar(dst=t[:p], data=t[:p], op0=nl.multiply, operand0=s)
    nisa.dma_copy(dst=out[i * 128:i * 128 + p, :], src=t[:p])
    return out


@nki.jit
def relu_fwd(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.maximum(nl.load(x), 0.0))
    return out


@nki.jit
def relu_bwd(grad, x):
    """grad * (x > 0)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g = nl.load(grad)
    t = nl.load(x)
    mask = nl.greater(t, 0.0, dtype=x.dtype)
    nl.store(out, nl.multiply(g, mask))
    return out


@nki.jit
def add_into(out, a, b):
    """out[...] = a + b, in place (returns nothing)."""
    nl.store(out, nl.add(nl.load(a), nl.load(b)))


@nki.jit
def rowsum_and_max(x):
    """Two outputs: per-row sum and max, [R, 1] each."""
    R, C = x.shape
    s = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    m = nl.ndarray((R, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(s, nl.sum(t, axis=1, keepdims=True, dtype=nl.float32))
    nl.store(m, nl.max(t, axis=1, keepdims=True))
    return s, m


scale_op = torch_neuronx.nki_op("nki_op_test::scale", scale_rows, grid=lambda x, s: ((x.shape[0] + 127) // 128,))
relu_op = torch_neuronx.nki_op("nki_op_test::relu", relu_fwd, output_like="x")
relu_bwd_op = torch_neuronx.nki_op("nki_op_test::relu_bwd", relu_bwd)
add_into_op = torch_neuronx.nki_op("nki_op_test::add_into", add_into, mutates_args=("out",))
stats_op = torch_neuronx.nki_op("nki_op_test::stats", rowsum_and_max, returns=2)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return relu_bwd_op(grad.contiguous(), x)


relu_op.register_autograd(_backward, setup_context=_setup)


@torch_neuronx.nki_op("nki_op_test::softplus_scaled", mutates_args=())
def softplus_scaled(x: torch.Tensor, beta: float) -> torch.Tensor:
    """The typed-function form (AWS's docs): any code that launches kernels."""
    @nki.jit
    def k(x, beta):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, nl.log(nl.add(nl.exp(nl.multiply(t, beta)), 1.0)))
        return out

    return k(x, beta)


# ----------------------------------------------------------------------------------------------- eager
def test_schemas_from_kernel_parameters():
    assert scale_op._nki.schema_str == "(Tensor x, float s=2.0) -> Tensor"
    assert add_into_op._nki.schema_str == "(Tensor(a!) out, Tensor a, Tensor b) -> ()"
    assert stats_op._nki.schema_str == "(Tensor x) -> (Tensor, Tensor)"
    assert torch.ops.nki_op_test.scale.default._schema.name == "nki_op_test::scale"


def test_eager_neuron_grid_scalars_and_defaults():
    x = torch.randn(300, 40, device=DEV)  # 3 programs, the last one partial
    y = scale_op(x, 0.5)
    assert y.device.type == "neuron" and y.shape == x.shape
    torch.testing.assert_close(y.cpu(), x.cpu() * 0.5)
    torch.testing.assert_close(scale_op(x).cpu(), x.cpu() * 2.0)  # the kernel's default
    xb = x.to(torch.bfloat16)
    torch.testing.assert_close(torch.ops.nki_op_test.scale(xb, 3.0).cpu(), xb.cpu() * 3.0)


def test_eager_in_place_and_two_outputs_and_function_form():
    a = torch.randn(64, 48, device=DEV)
    b = torch.randn(64, 48, device=DEV)
    out = torch.zeros(64, 48, device=DEV)
    assert add_into_op(out, a, b) is None
    torch.testing.assert_close(out.cpu(), (a + b).cpu())
    s, m = stats_op(a)
    torch.testing.assert_close(s.cpu(), a.cpu().sum(1, keepdim=True), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.cpu(), a.cpu().amax(1, keepdim=True))
    torch.testing.assert_close(softplus_scaled(a, 2.0).cpu(), torch.nn.functional.softplus(a.cpu() * 2.0),
                               rtol=1e-5, atol=1e-5)


def test_fake_tensor_shapes_traced_once_per_signature():
    from torch._subclasses.fake_tensor import FakeTensorMode

    before = stats_op._nki.traced_runs
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.empty(40, 24, device=DEV))
        s, m = stats_op(x)
        s2, _ = stats_op(x)
    assert s.shape == (40, 1) and s.dtype == torch.float32 and m.shape == (40, 1) and m.dtype == torch.float32
    assert s.device.type == "neuron" and s2.shape == (40, 1)
    assert stats_op._nki.traced_runs == before + 1  # the second call hit the cache
    runs = relu_op._nki.traced_runs
    with FakeTensorMode() as mode:
        y = relu_op(mode.from_tensor(torch.empty(8, 4, dtype=torch.bfloat16, device=DEV)))
    assert y.shape == (8, 4) and y.dtype == torch.bfloat16 and relu_op._nki.traced_runs == runs  # output_like


# ----------------------------------------------------------------------------------------------- compile
def test_torch_compile_fullgraph_functional_mutating_and_multi_output():
    torch._dynamo.reset()

    def f(x, y):  # only custom ops: the test times the integration, not Inductor's C++ code generation
        h = scale_op(x, 3.0)
        out = torch.empty_like(h)
        add_into_op(out, h, y)
        s, m = stats_op(out)
        return softplus_scaled(out, 0.5), s, m

    x = torch.randn(120, 64, device=DEV)
    y = torch.randn(120, 64, device=DEV)
    ref = f(x, y)
    cf = torch.compile(f, backend="neuron", fullgraph=True)
    got = cf(x, y)
    for r, g in zip(ref, got):
        assert g.device.type == "neuron"
        torch.testing.assert_close(g.cpu(), r.cpu(), rtol=1e-5, atol=1e-5)
    runs = scale_op._nki.traced_runs
    got = cf(x * 2, y)  # same shapes: no retrace, no recompile
    torch.testing.assert_close(got[2].cpu(), f(x * 2, y)[2].cpu())
    assert scale_op._nki.traced_runs == runs


def test_autograd_eager_and_compiled():
    x = torch.randn(32, 16, device=DEV, requires_grad=True)
    g = torch.randn(32, 16, device=DEV)
    relu_op(x).backward(g)
    torch.testing.assert_close(x.grad.cpu(), (g.cpu() * (x.detach().cpu() > 0)))

    torch._dynamo.reset()
    xc = torch.randn(32, 16, device=DEV, requires_grad=True)
    y = torch.compile(relu_op, backend="neuron", fullgraph=True)(xc)  # forward and backward graphs
    y.backward(g)
    torch.testing.assert_close(y.detach().cpu(), xc.detach().cpu().relu())
    torch.testing.assert_close(xc.grad.cpu(), (g.cpu() * (xc.detach().cpu() > 0)))


def test_torch_compile_dynamic_shapes_map_output_sizes_to_symbols():
    torch._dynamo.reset()

    def f(x):
        return stats_op(scale_op(x, 2.0))

    cf = torch.compile(f, backend="neuron", fullgraph=True, dynamic=True)
    runs = stats_op._nki.traced_runs
    for rows in (40, 72, 100):
        x = torch.randn(rows, 48, device=DEV)
        s, m = cf(x)
        assert s.shape == (rows, 1) and m.shape == (rows, 1)
        torch.testing.assert_close(s.cpu(), (2 * x.cpu()).sum(1, keepdim=True), rtol=1e-5, atol=1e-4)
    assert stats_op._nki.traced_runs <= runs + 1  # one symbolic trace serves every size


# ----------------------------------------------------------------------------------------------- errors
def test_errors_name_the_kernel_and_the_argument():
    a = torch.randn(16, 8, device=DEV)
    with pytest.raises(RuntimeError, match=r"nki_op nki_op_test::add_into \(kernel add_into\): argument 'b' "
                                           r"is on cpu but argument 'out' is on neuron"):
        add_into_op(torch.zeros(16, 8, device=DEV), a, torch.randn(16, 8))
    with pytest.raises(RuntimeError, match=r"\(kernel relu_bwd\): argument 'x' has dtype torch.complex64"):
        relu_bwd_op(torch.randn(4, 4), torch.randn(4, 4, dtype=torch.complex64))
    with pytest.raises(nki.NkiError, match=r"nki_op nki_op_test::relu \(kernel relu_fwd\): .*partition"):
        relu_op(torch.randn(200, 8, device=DEV))  # a 200-partition tile

    @nki.jit
    def echo(x):
        return x

    echo_op = torch_neuronx.nki_op("nki_op_test::echo", echo)
    with pytest.raises(RuntimeError, match=r"\(kernel echo\): argument 'x' is returned as output 0"):
        echo_op(a)
    with pytest.raises(ValueError, match=r"\(kernel add_into\): mutates_args names 'c'"):
        torch_neuronx.nki_op("nki_op_test::bad", add_into, mutates_args=("c",))
    with pytest.raises(RuntimeError, match=r"\(kernel rowsum_and_max\): the kernel returned 2 output\(s\), the op "
                                           r"declares 1"):
        torch_neuronx.nki_op("nki_op_test::stats1", rowsum_and_max)(a)


def test_import_torch_stays_lazy():
    code = "import sys, torch; import torch_neuronx; print('nki' in sys.modules, 'torch_neuronx._nki_op' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         cwd="/")
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_numpy_blas_runs_on_one_thread_after_a_launch():
    """nki sets numpy's OpenBLAS to NKI_NUMPY_BLAS_THREADS (default 1) at the first launch (docs/nki.md)."""
    import ctypes

    libs = {l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l.lower() and l.split()[-1][:1] == "/"}
    getters = [getattr(ctypes.CDLL(p), "scipy_openblas_get_num_threads64_", None) for p in libs]
    getters = [g for g in getters if g is not None]
    if not getters:
        pytest.skip("numpy is not linked to scipy-openblas here")
    relu_op(torch.randn(4, 4))
    assert all(g() == 1 for g in getters)


def test_hub_layer_through_nki_op_under_torch_compile(monkeypatch):
    """examples/kernels/relu-nki's layer calls nki_op custom ops: kernelize(TORCH_COMPILE) + fullgraph compile.
    (Here rather than in test_nki_hub.py: this process has Inductor warm already.)"""
    kernels = pytest.importorskip("kernels")
    from pathlib import Path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = Path(__file__).resolve().parent.parent / "examples" / "kernels" / "relu-nki"

    @kernels.use_kernel_forward_from_hub("ReLUCompile")
    class ReLU(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.relu(x)

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), ReLU(), torch.nn.Linear(32, 8)).to(DEV).eval()
    x = torch.randn(24, 16, device=DEV)
    ref = model(x).detach()
    mapping = {"ReLUCompile": {"neuron": kernels.LocalLayerRepository(repo_path=repo, layer_name="ReLU")}}
    with kernels.use_kernel_mapping(mapping):
        model = kernels.kernelize(model, device="neuron", mode=kernels.Mode.INFERENCE | kernels.Mode.TORCH_COMPILE)
    torch._dynamo.reset()
    calls = []
    orig = nki.Kernel.__call__
    monkeypatch.setattr(nki.Kernel, "__call__", lambda self, *a, **k: calls.append(self.__name__) or orig(self, *a, **k))
    with torch.no_grad():
        out = torch.compile(model, backend="neuron", fullgraph=True)(x)
    assert "relu_kernel" in calls  # the Hub kernel ran inside the compiled graph (and once for the fake trace at most)
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)


def test_opcheck():
    """torch.library.opcheck: schema, fake tensors, autograd registration, AOT dispatch (static and dynamic)."""
    a, b = torch.randn(64, 48, device=DEV), torch.randn(64, 48, device=DEV)
    cases = [(scale_op, (torch.randn(130, 40, device=DEV), 0.5)), (add_into_op, (torch.zeros(64, 48, device=DEV), a, b)),
             (stats_op, (a,)), (softplus_scaled, (a, 2.0)),
             # torch's autograd_registration_check handles only CPU/CUDA/XPU devices: relu on CPU tensors
             (relu_op, (torch.randn(32, 16, requires_grad=True),))]
    for op, args in cases:
        torch.library.opcheck(op, args)
