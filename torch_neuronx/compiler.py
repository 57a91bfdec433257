"""``torch.compile`` on neuron: the ``neuron`` Dynamo backend, its compile cache, and the compile report.

The backend is Inductor with the neuron code generator (C++ kernels run on device memory, matmuls and
attention call ATen operators on neuron), plus defaults suited to the device:

* static shapes unless ``dynamic=True`` is asked: when Dynamo hands over a graph with symbolic sizes
  (after a shape change), the backend compiles one static graph per distinct shape instead;
* a persistent compile cache (Inductor's FX graph cache and AOTAutograd cache) in
  ``$TORCH_NEURONX_CACHE_DIR`` (default ``~/.cache/torch_neuronx``), subdirectory ``inductor``. Entries are
  written atomically; an entry that cannot be read or loaded is recompiled, never used;
* one line on stderr per graph compiled (graph, operators, seconds, cache hit or not);
  ``TORCH_NEURONX_COMPILE_QUIET=1`` silences it.

``report()`` summarizes what was compiled in this process: graphs, recompiles with the guard that failed,
graph breaks with their reason and ``file:line``, and cache hits. ``TORCH_NEURONX_COMPILE_REPORT=1`` prints
it at exit.

``torch.compile(model, backend="neuron")`` finds the backend through the ``torch_dynamo_backends`` entry
point; importing this module also registers it (for source checkouts without installed metadata).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from . import _inductor

__all__ = ["neuron_backend", "report", "stats", "reset_stats", "cache_dir"]

_lock = threading.Lock()


# --------------------------------------------------------------------------------------------------
# Settings


def cache_dir() -> str:
    """Root of the persistent compile cache."""
    root = os.environ.get("TORCH_NEURONX_CACHE_DIR")
    if not root:
        root = os.path.join(os.path.expanduser("~"), ".cache", "torch_neuronx")
    return os.path.abspath(root)


def _quiet() -> bool:
    return os.environ.get("TORCH_NEURONX_COMPILE_QUIET", "0") not in ("", "0")


_cache_ready = False


def _use_cache_dir() -> None:
    """Points Inductor's caches (FX graphs, AOTAutograd, kernels) at the neuron cache directory, for the
    whole process: backward graphs are compiled lazily, after the backend returns, and must find the same
    directory."""
    global _cache_ready
    if _cache_ready:
        return
    from torch._inductor.utils import clear_caches

    target = os.path.join(cache_dir(), "inductor")
    os.makedirs(target, exist_ok=True)
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") != target:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = target
        clear_caches()  # Inductor memoizes paths under the previous directory
    _cache_ready = True


_probe_thread: Optional[threading.Thread] = None


def _start_isa_probes() -> None:
    """Starts Inductor's vector-ISA probes in the background.

    Inductor finds which vector ISAs the host compiler and CPU support by loading a test library in one
    subprocess per ISA, in every new process, on its first compile (about 0.9 s here, a quarter of a
    warm-cache compile of the decode graph). Run from here, when the backend is looked up, they overlap
    with loading the model and Dynamo's tracing; the first compile waits for them (``_wait_isa_probes``).
    The modules they need are imported here, in the calling thread, so the two threads never import
    concurrently."""
    global _probe_thread
    from torch._inductor import codecache, cpp_builder, cpu_vec_isa, utils  # noqa: F401

    def probe() -> None:
        try:
            _use_cache_dir()
            cpu_vec_isa.pick_vec_isa()
        except Exception:  # noqa: BLE001
            pass  # the first compile probes again, in its own thread, and reports what fails

    _probe_thread = threading.Thread(target=probe, name="torch_neuronx-isa-probe", daemon=True)
    _probe_thread.start()


def _wait_isa_probes() -> None:
    t = _probe_thread
    if t is not None:
        t.join()


# --------------------------------------------------------------------------------------------------
# Records for the report


@dataclasses.dataclass
class GraphRecord:
    index: int
    kind: str  # "forward", "backward" or "inference"
    where: str  # the compiled function and its file:line
    compile_id: str
    ops: int
    seconds: float
    cache: str  # "hit", "miss" or "bypass"
    shapes: str = ""


_graphs: List[GraphRecord] = []
_graph_breaks: "collections.OrderedDict[tuple, int]" = collections.OrderedDict()
_next_graph = 0


def reset_stats() -> None:
    """Starts the report afresh: forgets the graphs, graph breaks and Dynamo's per-frame records."""
    global _next_graph
    from torch._dynamo.utils import clear_compilation_metrics, graph_break_reasons

    clear_compilation_metrics()
    graph_break_reasons.clear()
    with _lock:
        _graphs.clear()
        _graph_breaks.clear()
        _next_graph = 0


def _counter_snapshot() -> Dict[str, int]:
    return {
        "fx_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
        "fx_bypass": counters["inductor"]["fxgraph_cache_bypass"],
        "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
        "aot_miss": counters["aot_autograd"]["autograd_cache_miss"],
    }


def _cache_outcome(before: Dict[str, int], after: Dict[str, int]) -> str:
    d = {k: after[k] - before[k] for k in after}
    if d["aot_hit"] or (d["fx_hit"] and not d["fx_miss"]):
        return "hit"
    if d["fx_miss"] or d["aot_miss"]:
        return "miss"
    return "bypass"


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _user_frame_of(gm: torch.fx.GraphModule) -> Optional[str]:
    """The outermost user frame in the graph's recorded stack traces (for compiled modules, Dynamo's frame
    is a torch wrapper; the traces name the user's ``forward``)."""
    import re

    for n in gm.graph.nodes:
        trace = n.meta.get("stack_trace")
        if not trace:
            continue
        for filename, line, name in re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace):
            if not filename.startswith(_TORCH_DIR):
                return f"{name} ({filename}:{line})"
    return None


def _current_location(gm: torch.fx.GraphModule) -> str:
    """The function Dynamo is compiling, as ``name (file:line)``."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = InstructionTranslator.current_tx().f_code
        if not code.co_filename.startswith(_TORCH_DIR):
            return f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
    except Exception:  # noqa: BLE001  (no translator: called outside Dynamo)
        pass
    return _user_frame_of(gm) or "?"


def _current_compile_id() -> str:
    cid = torch._guards.CompileContext.current_compile_id()
    return str(cid) if cid is not None else "?"


def _count_ops(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def _short_reason(reason: Optional[str]) -> str:
    """The headline of a Dynamo graph-break message and its explanation, without hints and links."""
    if not reason:
        return "?"
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    text = lines[0]
    for ln in lines[1:]:
        if ln.startswith("Explanation:"):
            text += ": " + ln[len("Explanation:"):].strip()
    return text


def _note_graph_breaks() -> None:
    # Dynamo keeps the reasons until torch._dynamo.reset(); copy them so the report outlives a reset.
    from torch._dynamo.utils import graph_break_reasons

    for r in list(graph_break_reasons):
        frame = r.user_stack[-1] if r.user_stack else None
        loc = f"{frame.filename}:{frame.lineno}" if frame is not None else "?"
        key = (_short_reason(r.reason), loc, id(r))
        if key not in _graph_breaks:
            _graph_breaks[key] = 1


def _record(kind: str, where: str, compile_id: str, ops: int, seconds: float, cache: str,
            shapes: str = "") -> GraphRecord:
    global _next_graph
    with _lock:
        rec = GraphRecord(_next_graph, kind, where, compile_id, ops, seconds, cache, shapes)
        _next_graph += 1
        _graphs.append(rec)
    if not _quiet():
        hit = {"hit": ", cache hit", "miss": "", "bypass": ", not cached"}[cache]
        extra = f", shapes {shapes}" if shapes else ""
        print(f"[neuron] compiled graph {rec.index} ({kind}) of {where} [{compile_id}]: {ops} ops in "
              f"{seconds:.2f} s{hit}{extra}", file=sys.stderr, flush=True)
    return rec


# --------------------------------------------------------------------------------------------------
# The backend


def _config_patches(mode: Optional[str], options: Optional[dict]) -> Dict[str, Any]:
    # Generated C++ kernels are OpenMP-parallel like CPU Inductor's: the kernel library runs its loops on the
    # same OpenMP pool (PyTorch's intra-op pool), so the two share threads instead of spinning against each
    # other. (While the library had a pool of its own they ran single-threaded; a Flux-width transformer's
    # generated kernels then took 378 ms per image against CPU Inductor's 69 ms, compiled decode 54 tok/s
    # against 66 now.) options={"cpp.threads": n} overrides.
    # fallback_random: random ops (dropout, rand) in a graph call the device's ATen kernels and draw from
    # the neuron generator as eager does, so a compiled step with dropout equals the eager step from the
    # same seed (Inductor's own generated RNG draws other numbers). They are not fused; they are rare.
    patches: Dict[str, Any] = {"fx_graph_cache": True, "fallback_random": True}
    if mode not in (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        raise RuntimeError(f"neuron backend: unknown mode {mode!r}; expected one of 'default', "
                           "'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs'")
    # reduce-overhead means CUDA graphs, which do not exist here; generated kernels are already launched
    # from one Python call per graph.
    for k, v in (options or {}).items():
        if k in ("triton.cudagraphs", "cudagraphs"):
            continue
        patches[k] = v
    return patches


def _is_symbolic(example_inputs: Sequence[Any]) -> bool:
    for a in example_inputs:
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(a, torch.Tensor):
            if any(isinstance(s, torch.SymInt) for s in a.shape) or \
                    any(isinstance(s, torch.SymInt) for s in a.stride()):
                return True
    return False


def _shape_key(args: Sequence[Any]) -> tuple:
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((tuple(a.shape), tuple(a.stride()), a.storage_offset()))
        elif isinstance(a, (int, float, bool)):
            key.append(a)
        else:
            key.append(type(a).__name__)
    return tuple(key)


def _describe_shapes(args: Sequence[Any]) -> str:
    return ", ".join(str(tuple(a.shape)) if isinstance(a, torch.Tensor) else repr(a)
                     for a in args if isinstance(a, (torch.Tensor, int)))


class _Compiler:
    """One Dynamo graph: compiles it with Inductor and records every inner (forward/backward) graph."""

    def __init__(self, gm: torch.fx.GraphModule, patches: Dict[str, Any], where: str, compile_id: str):
        self.gm = gm
        self.patches = patches
        self.where = where
        self.compile_id = compile_id

    def _inner(self, shapes: str) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx_inner

        def inner_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *args: Any,
                          **kwargs: Any) -> Any:
            is_backward = bool(kwargs.get("is_backward", False))
            is_inference = bool(kwargs.get("is_inference", False))
            kind = "backward" if is_backward else ("inference" if is_inference else "forward")
            before = _counter_snapshot()
            t0 = time.perf_counter()
            out = compile_fx_inner(gm, example_inputs, *args, **kwargs)
            _record(kind, self.where, self.compile_id, _count_ops(gm), time.perf_counter() - t0,
                    _cache_outcome(before, _counter_snapshot()), shapes)
            return out

        return inner_compile

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], shapes: str = "") -> Any:
        from torch._inductor.compile_fx import compile_fx

        _wait_isa_probes()
        _use_cache_dir()
        before = _counter_snapshot()
        t0 = time.perf_counter()
        try:
            out = compile_fx(gm, example_inputs, inner_compile=self._inner(shapes), config_patches=self.patches)
        except Exception as e:  # noqa: BLE001
            # A cached artifact that exists but cannot be loaded (a truncated kernel library, a damaged
            # wrapper module, a probe result) is not trusted: compile this graph once more, afresh, in a
            # private directory. A genuine compile error fails again there and is raised from there.
            if not _quiet():
                print(f"[neuron] compiling with the cache failed ({type(e).__name__}: "
                      f"{str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}); recompiling without "
                      "the cache", file=sys.stderr, flush=True)
            out = _compile_uncached(gm, example_inputs, self._inner(shapes), self.patches)
        after = _counter_snapshot()
        if after["aot_hit"] > before["aot_hit"]:
            # AOTAutograd served forward and backward from its cache: no inner compile ran.
            _record("forward+backward" if _needs_grad(example_inputs) else "inference", self.where,
                    self.compile_id, _count_ops(gm), time.perf_counter() - t0, "hit", shapes)
        return _profiled(out, f"graph {self.compile_id} of {self.where}",
                         f"graph {self.compile_id} backward of {self.where}")


def _neuron_device_of(args: Sequence[Any]) -> int:
    """The index of the first neuron tensor among ``args`` (-1: none, the current device is taken)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "neuron":
            return a.device.index or 0
    return -1


def _in_graph_range(name: str, fn: Callable[..., Any], args: Sequence[Any], *call: Any) -> Any:
    from . import _C

    device = _neuron_device_of(args)  # before the call: a backward consumes its argument list
    with torch.profiler.record_function(name):
        token = _C._prof_range_begin(name, device)
        try:
            return fn(*call)
        finally:
            _C._prof_range_end(token)


def _profiled(compiled: Any, name: str, backward_name: str) -> Any:
    """The compiled function of a Dynamo graph as one event for torch.profiler: a record_function range on
    the CPU row and a "[neuron graph] ..." range on the row of the device it runs on, holding the kernels
    it runs. With no profiler recording, a call costs two flag checks more.

    Its backward graph runs from the autograd engine, inside AOTAutograd's ``CompiledFunction``: a forward
    finds that class through its outputs' ``grad_fn`` and wraps its backward the same way, once. The first
    calls look for it (a graph first called under ``no_grad`` has no ``grad_fn`` yet); after three without
    one, only calls under a profiler do, so an inference graph costs nothing more."""
    import functools

    from . import _C

    if not callable(compiled):
        return compiled
    active = _C._prof_active
    backward_wrapped = False
    tries = 3

    @functools.wraps(compiled)
    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal backward_wrapped, tries
        profiling = active()
        if not profiling and (backward_wrapped or not tries):
            return compiled(*args, **kwargs)
        if profiling:
            out = _in_graph_range(name, lambda: compiled(*args, **kwargs), args)
        else:
            out = compiled(*args, **kwargs)
            tries -= 1
        if not backward_wrapped:
            backward_wrapped = _profile_backward(out, backward_name)
        return out

    return run


def _aot_function_of(outputs: Any) -> Optional[type]:
    """AOTAutograd's ``CompiledFunction`` that produced ``outputs``: the ``_forward_cls`` of their
    ``grad_fn``, or of a node or two above it (outputs that are views are regenerated after the function)."""
    outs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    for t in outs:
        if not isinstance(t, torch.Tensor):
            continue
        node = t.grad_fn
        for _ in range(3):
            if node is None:
                break
            cls = getattr(type(node), "_forward_cls", None)
            if cls is not None and hasattr(cls, "_aot_id") and hasattr(cls, "_backward_impl"):
                return cls
            parents = node.next_functions
            node = parents[0][0] if parents else None
    return None


def _profile_backward(outputs: Any, name: str) -> bool:
    """Wraps the backward of the graph that produced ``outputs`` in a graph range named ``name``; False if
    they are not the outputs of a differentiable compiled graph."""
    from . import _C

    cls = _aot_function_of(outputs)
    if cls is None:
        return False
    impl = cls._backward_impl
    if getattr(impl, "_neuron_profiled", False):
        return True
    active = _C._prof_active

    # AOTAutograd calls CompiledFunction._backward_impl(ctx, all_args) from backward(), looked up on the
    # class at each call; it compiles the backward graph on first use, then runs it.
    def backward_impl(ctx: Any, all_args: List[Any]) -> Any:
        if not active():
            return impl(ctx, all_args)
        return _in_graph_range(name, impl, all_args, ctx, all_args)

    backward_impl._neuron_profiled = True  # type: ignore[attr-defined]
    cls._backward_impl = staticmethod(backward_impl)
    return True


def _needs_grad(example_inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in example_inputs)


def _clear_isa_probes() -> None:
    # Inductor memoizes which vector ISAs work by building probe libraries in the cache directory; a
    # damaged probe makes it believe none does. Probe again.
    import inspect

    from torch._inductor import cpu_vec_isa

    for obj in list(vars(cpu_vec_isa).values()):
        if hasattr(obj, "cache_clear"):
            obj.cache_clear()
        if inspect.isclass(obj):
            for attr in vars(obj).values():
                if hasattr(attr, "cache_clear"):
                    attr.cache_clear()


def _compile_uncached(gm, example_inputs, inner_compile, patches) -> Any:
    """Compiles in a private, empty directory. If that works where the shared cache failed, the shared
    cache is damaged: it is moved aside and deleted, so later compiles rebuild it."""
    import atexit
    import shutil
    import tempfile

    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import clear_caches

    fresh = tempfile.mkdtemp(prefix="torch_neuronx-recompile-")
    atexit.register(shutil.rmtree, fresh, True)
    shared = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh
    clear_caches()
    _clear_isa_probes()
    try:
        with torch._functorch.config.patch(enable_autograd_cache=False, force_non_lazy_backward_lowering=True):
            out = compile_fx(gm, example_inputs, inner_compile=inner_compile,
                             config_patches={**patches, "fx_graph_cache": False})
    finally:
        if shared is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = shared
        clear_caches()
        _clear_isa_probes()
    if shared:
        aside = f"{shared}.damaged-{os.getpid()}-{time.time_ns()}"
        try:
            os.rename(shared, aside)  # atomic: other processes see either the old tree or none
        except OSError:
            pass
        else:
            shutil.rmtree(aside, ignore_errors=True)
        os.makedirs(shared, exist_ok=True)
        if not _quiet():
            print(f"[neuron] the compile cache in {shared} was damaged and has been cleared",
                  file=sys.stderr, flush=True)
    return out


class _StaticSpecializer:
    """Runs a graph Dynamo made dynamic as one static compiled graph per distinct input shape."""

    def __init__(self, compiler: _Compiler, example_inputs: Sequence[Any]):
        self.compiler = compiler
        self.compiled: Dict[tuple, Callable[..., Any]] = {}
        self.sym_positions = [i for i, a in enumerate(example_inputs)
                              if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool))]

    def _specialize(self, args: Sequence[Any]) -> Callable[..., Any]:
        import copy

        gm = self.compiler.gm
        graph = copy.deepcopy(gm.graph)
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        for i in self.sym_positions:
            node, value = placeholders[i], args[i]
            for user in list(node.users):
                user.args = torch.fx.node.map_arg(user.args, lambda a: value if a is node else a)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a: value if a is node else a)
            node.meta.pop("val", None)
        for n in graph.nodes:  # symbolic metadata from Dynamo's trace must not leak into the static one
            n.meta.pop("val", None)
            n.meta.pop("example_value", None)
            n.meta.pop("tensor_meta", None)
        static_gm = torch.fx.GraphModule(gm, graph)
        keep = [i for i in range(len(args)) if i not in set(self.sym_positions)]
        for i in reversed(self.sym_positions):
            graph.erase_node(placeholders[i])
        static_gm.recompile()
        static_args = [args[i] for i in keep]
        fakes = _fake_like(static_args)
        compiled = self.compiler.compile(static_gm, fakes, shapes=_describe_shapes(static_args))

        def run(*call_args: Any) -> Any:
            return compiled(*[call_args[i] for i in keep])

        return run

    def __call__(self, *args: Any) -> Any:
        key = _shape_key(args)
        fn = self.compiled.get(key)
        if fn is None:
            with _lock_specialize:
                fn = self.compiled.get(key)
                if fn is None:
                    fn = self._specialize(args)
                    self.compiled[key] = fn
        return fn(*args)


_lock_specialize = threading.RLock()


def _fake_like(args: Sequence[Any]) -> List[Any]:
    """Static fake tensors shaped like ``args`` (no device work while compiling)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv(assume_static_by_default=True), static_shapes=True)
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(mode.from_tensor(a, static_shapes=True))
        else:
            out.append(a)
    return out


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, mode: Optional[str] = None,
                   options: Optional[dict] = None) -> Callable[..., Any]:
    """The ``neuron`` Dynamo backend (``torch.compile(model, backend="neuron")``)."""
    _inductor.register()
    _note_graph_breaks()
    compiler = _Compiler(gm, _config_patches(mode, options), _current_location(gm), _current_compile_id())
    if _is_symbolic(example_inputs) and torch._dynamo.config.assume_static_by_default:
        # Dynamo generalized a size after seeing it change, but the user did not ask for dynamic shapes:
        # keep kernels static (specialized loops, no size arithmetic), one per shape actually used.
        return _StaticSpecializer(compiler, example_inputs)
    return compiler.compile(gm, example_inputs)


# --------------------------------------------------------------------------------------------------
# Report


def stats() -> Dict[str, Any]:
    """What was compiled in this process, as data (see ``report()``)."""
    from torch._dynamo.utils import _compilation_metrics

    _note_graph_breaks()
    frames = []
    recompiles = []
    for m in list(_compilation_metrics):
        if m.co_name is None:
            continue
        where = f"{m.co_name} ({m.co_filename}:{m.co_firstlineno})"
        frame = {"compile_id": m.compile_id, "where": where, "ops": m.graph_op_count,
                 "seconds": m.entire_frame_compile_time_s, "recompile_reason": m.recompile_reason,
                 "fail_reason": m.fail_reason,
                 "cache_hits": (m.inductor_fx_local_cache_hit_count or 0)
                 + (m.aotautograd_local_cache_hit_count or 0)}
        frames.append(frame)
        if m.recompile_reason:
            recompiles.append({"compile_id": m.compile_id, "where": where, "reason": m.recompile_reason})
    breaks: Dict[tuple, int] = collections.OrderedDict()
    for (reason, loc, _), n in _graph_breaks.items():
        breaks[(reason, loc)] = breaks.get((reason, loc), 0) + n
    with _lock:
        graphs = [dataclasses.asdict(g) for g in _graphs]
    return {
        "graphs": graphs,
        "frames": frames,
        "recompiles": recompiles,
        "graph_breaks": [{"reason": r, "location": loc, "count": n} for (r, loc), n in breaks.items()],
        "cache_hits": sum(1 for g in graphs if g["cache"] == "hit"),
        "fx_graph_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
        "aot_autograd_cache_hits": counters["aot_autograd"]["autograd_cache_hit"],
        "cache_dir": os.path.join(cache_dir(), "inductor"),
    }


def report(file: Any = None) -> str:
    """Prints (to ``file``, default stderr) and returns a summary of compilation in this process."""
    s = stats()
    lines = ["torch_neuronx compile report",
             f"  graphs compiled by the neuron backend: {len(s['graphs'])} "
             f"(cache hits: {s['cache_hits']}; cache: {s['cache_dir']})"]
    for g in s["graphs"]:
        lines.append(f"    graph {g['index']} {g['kind']:<9} {g['where']} [{g['compile_id']}]: {g['ops']} ops, "
                     f"{g['seconds']:.2f} s, cache {g['cache']}" + (f", shapes {g['shapes']}" if g["shapes"] else ""))
    lines.append(f"  frames compiled by Dynamo (any backend): {len(s['frames'])} "
                 f"(Inductor FX cache hits {s['fx_graph_cache_hits']}, "
                 f"AOTAutograd cache hits {s['aot_autograd_cache_hits']})")
    for f in s["frames"]:
        ops = "?" if f["ops"] is None else f["ops"]
        secs = "?" if f["seconds"] is None else f"{f['seconds']:.2f}"
        fail = f", failed: {f['fail_reason'][:120]}" if f["fail_reason"] else ""
        lines.append(f"    [{f['compile_id']}] {f['where']}: {ops} ops, {secs} s{fail}")
    lines.append(f"  recompiles: {len(s['recompiles'])}")
    for r in s["recompiles"]:
        lines.append(f"    [{r['compile_id']}] {r['where']}: guard failed: {r['reason']}")
    lines.append(f"  graph breaks: {len(s['graph_breaks'])}")
    for b in s["graph_breaks"]:
        count = f" (x{b['count']})" if b["count"] > 1 else ""
        lines.append(f"    {b['location']}: {b['reason']}{count}")
    text = "\n".join(lines)
    print(text, file=file if file is not None else sys.stderr, flush=True)
    return text


def _register() -> None:
    from torch._dynamo.backends import registry
    from torch._dynamo.utils import set_compilation_metrics_limit

    set_compilation_metrics_limit(4096)  # the report reads Dynamo's per-frame records
    with _lock:
        if "neuron" in registry._COMPILER_FNS:
            return
        registry._discover_entrypoint_backends()
        if registry._BACKENDS.get("neuron") is None:
            # No installed entry point (a source checkout): register directly.
            registry.register_backend(compiler_fn=neuron_backend, name="neuron")


_register()


_start_isa_probes()
