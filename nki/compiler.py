"""``nki.compiler``: compiler directives. Scheduling hints are accepted and have no effect in the interpreter;
explicit allocation (``sbuf.mod_alloc`` ...) is not supported yet."""

from ._core import NkiError


def skip_middle_end_transformations(fn):
    return fn


def enable_stack_allocator(*a, **k):
    return (lambda f: f) if not (a and callable(a[0])) else a[0]


def force_auto_alloc(fn):
    return fn


class no_reorder:
    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _Allocators:
    def __getattr__(self, name):
        def unsupported(*a, **k):
            raise NkiError(f"nki.compiler.{self._region}.{name}: explicit allocation is not supported by this nki")
        return unsupported

    def __init__(self, region):
        self._region = region


sbuf = _Allocators("sbuf")
psum = _Allocators("psum")
