import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

import torch_neuronx  # noqa: F401  (also auto-loaded by `import torch`)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Compiled graphs go to a per-session cache, not the user's ~/.cache/torch_neuronx.
_compile_cache = tempfile.mkdtemp(prefix="torch_neuronx-test-cache-")
atexit.register(shutil.rmtree, _compile_cache, True)
os.environ.setdefault("TORCH_NEURONX_CACHE_DIR", _compile_cache)


@contextlib.contextmanager
def native_small_products():
    """fp32/fp64 products small enough to run CPU's GEMM (for CPU's bits) run the native kernel instead,
    so that kernel tests reach it on small odd shapes."""
    old = torch_neuronx._C._cpu_bits_macs(0)
    try:
        yield
    finally:
        torch_neuronx._C._cpu_bits_macs(old)


def run_python(code: str, env: dict = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for environment variables read once at start)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture
def python():
    return run_python


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.slow` cases run only with RUN_SLOW=1 (`make test-slow`): each is a variant (more ranks,
    another dtype, a second backend) of a case the default suite keeps, so `make test` stays within its budget."""
    if os.environ.get("RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long mode: RUN_SLOW=1 (make test-slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
