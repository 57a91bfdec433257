"""Runs a function on a module once it has finished loading, without importing it.

``when_loaded(name, ready, fn)``: ``fn(module)`` runs now if the module is loaded (``ready`` is an attribute it
defines late), else right after it loads (its loader is wrapped by a one-shot finder). A module that is still
executing when this is called (it imported torch, which loaded torch_neuronx, before defining ``ready``) is patched
at the next import anywhere or call of ``torch.neuron.is_available()`` once ``ready`` exists.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Callable, Dict, List, Tuple

_lock = threading.Lock()
_pending: Dict[str, List[Tuple[str, Callable]]] = {}  # module -> [(ready attribute, fn)] not run yet


def _run(name: str, module) -> None:
    with _lock:
        todo = _pending.get(name, [])
        left = [(ready, fn) for ready, fn in todo if not hasattr(module, ready)]
        run = [fn for ready, fn in todo if hasattr(module, ready)]
        if left:
            _pending[name] = left
        else:
            _pending.pop(name, None)
    for fn in run:
        fn(module)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str):
        self._inner, self._name = inner, name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        _run(self._name, module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        flush()  # modules caught while executing: patch them as soon as they are ready
        if fullname not in _pending or fullname in sys.modules:
            self._maybe_leave()
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec

    def _maybe_leave(self) -> None:
        if not _pending:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass


def flush() -> None:
    """Patches the modules caught while executing that are ready now (called by torch.neuron.is_available, which
    Transformers and Accelerate call before training)."""
    for name in [n for n in list(_pending) if n in sys.modules]:
        _run(name, sys.modules[name])


def when_loaded(name: str, ready: str, fn: Callable) -> None:
    with _lock:
        _pending.setdefault(name, []).append((ready, fn))
    module = sys.modules.get(name)
    if module is not None:
        _run(name, module)
    with _lock:
        if _pending and not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
