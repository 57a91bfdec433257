"""Diffusers pipelines on neuron: tiny random pipelines built from configs (torch_neuronx.testing.tiny_diffusers),
saved with save_pretrained and loaded with from_pretrained, give CPU's images.

fp32: max abs difference of the numpy images <= 1e-3. bf16: no further from CPU fp32 than CPU's own bf16 image,
times 2 (the issue's rule). The same CPU generator makes the noise on both sides (diffusers samples on CPU for
neuron). Compile: compile_repeated_blocks(backend="neuron") and a whole-model torch.compile equal eager, and a
second pipeline call compiles nothing.
"""

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from torch_neuronx import compiler  # noqa: E402
from torch_neuronx.testing import tiny_diffusers as td  # noqa: E402

DEV = "neuron"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """kind -> directory of the saved tiny pipeline, built on first use."""
    paths = {}

    def get(kind):
        if kind not in paths:
            paths[kind] = tmp_path_factory.mktemp(kind)
            td.make(kind, paths[kind])
        return paths[kind]

    return get


def run(kind, path, device, dtype=torch.float32, prepare=None, **kw):
    pipe = td.load(kind, path, dtype)
    inputs = td.prompt_inputs(kind, pipe, dtype)  # on CPU, before the pipeline moves
    pipe.to(device)
    if prepare is not None:
        prepare(pipe)
    args = td.call_kwargs(kind, **kw)
    return np.asarray(pipe(**td.to_device(inputs, device), **args).images, dtype=np.float32)


def maxdiff(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max())


@pytest.mark.parametrize("kind", td.KINDS)
def test_eager_fp32_equals_cpu(kind, saved):
    path = saved(kind)
    ref = run(kind, path, "cpu")
    got = run(kind, path, DEV)
    assert np.isfinite(got).all() and ref.std() > 0
    assert maxdiff(got, ref) <= 1e-3


@pytest.mark.parametrize("kind", ["qwenimage21", "flux", "sd"])
def test_eager_bf16_within_cpu_bf16_error(kind, saved):
    path = saved(kind)
    ref32 = run(kind, path, "cpu")
    cpu16 = run(kind, path, "cpu", torch.bfloat16)
    got16 = run(kind, path, DEV, torch.bfloat16)
    budget = 2 * maxdiff(cpu16, ref32)
    assert maxdiff(got16, ref32) <= max(budget, 1e-3), (maxdiff(got16, ref32), budget)


def _graphs():
    return len(compiler.stats()["graphs"])


@pytest.mark.parametrize("kind", ["qwenimage21", "flux"])
def test_compile_repeated_blocks_equals_eager(kind, saved):
    path = saved(kind)
    eager = run(kind, path, DEV)
    torch._dynamo.reset()
    compiler.reset_stats()
    pipe = td.load(kind, path)
    inputs = td.to_device(td.prompt_inputs(kind, pipe), DEV)
    pipe.to(DEV)
    pipe.transformer.compile_repeated_blocks(backend="neuron", fullgraph=True, dynamic=False)
    first = np.asarray(pipe(**inputs, **td.call_kwargs(kind)).images)
    n_first = _graphs()
    second = np.asarray(pipe(**inputs, **td.call_kwargs(kind)).images)
    # One graph per distinct repeated block class (Flux has two), each compiled once for the whole run.
    assert 1 <= n_first <= 4, compiler.report()
    assert _graphs() == n_first, compiler.report()
    assert not compiler.stats()["graph_breaks"], compiler.report()
    assert maxdiff(first, eager) <= 1e-3 and maxdiff(second, eager) <= 1e-3


def test_torch_compile_whole_unet(saved):
    path = saved("sd")
    eager = run("sd", path, DEV)
    torch._dynamo.reset()
    compiler.reset_stats()

    def prepare(pipe):
        pipe.unet = torch.compile(pipe.unet, backend="neuron", fullgraph=True, dynamic=False)

    first = run("sd", path, DEV, prepare=prepare)
    assert maxdiff(first, eager) <= 1e-3
    assert len(compiler.stats()["graphs"]) >= 1, compiler.report()


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_compiled_conv_layout_matches_eager(layout):
    """Inductor may turn a graph's convolutions channels-last; the traced (fake) output layout must be the one
    eager neuron produces (CPU's rule), else the compiled code fails its stride assertion."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1), torch.nn.GroupNorm(8, 16), torch.nn.SiLU(),
                            torch.nn.Conv2d(16, 16, 1)).to(DEV)
    x = torch.randn(2, 4, 16, 16, device=DEV)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    torch._dynamo.reset()
    c = torch.compile(m, backend="neuron", fullgraph=True, dynamic=False)
    with torch.no_grad():
        assert (c(x) - m(x)).abs().max().item() <= 1e-5
