"""What neuron-ls and `python -m torch_neuronx check` report: versions, environment, cores, problems."""

import glob
import importlib.metadata
import importlib.util
import os
import subprocess
import sys

PACKAGES = ("torch-neuronx", "torch", "transformers", "accelerate", "diffusers", "trl", "peft", "datasets",
            "safetensors", "tokenizers", "huggingface_hub", "kernels", "numpy")
ENV_VARS = ("NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_NUM_CHIPS", "NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES",
            "NEURON_RT_MEMORY_PER_CORE", "NEURON_RT_STATS", "NEURON_RT_STATS_DIR", "TORCH_DEVICE_BACKEND_AUTOLOAD")
_ORIG_ENV = dict(os.environ)  # before load_cores turns this process's own segment off
PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    if out["torch-neuronx"] is None:  # a source checkout on sys.path, not installed
        out["torch-neuronx"] = _package_version()
    return out


def _package_version():
    try:
        with open(os.path.join(PKG_DIR, "__init__.py")) as f:
            for line in f:
                if line.startswith("__version__"):
                    return line.split("=", 1)[1].strip().strip("\"'") + " (source tree)"
    except OSError:
        pass
    return None


def environment() -> dict:
    return {k: _ORIG_ENV.get(k) for k in ENV_VARS}


def extension_path():
    found = glob.glob(os.path.join(PKG_DIR, "_C.*.so")) + glob.glob(os.path.join(PKG_DIR, "_C.so"))
    return found[0] if found else None


def built_torch_version():
    """The torch the extension was built against (written by CMake next to it), or None."""
    path = os.path.join(PKG_DIR, "_build_info.py")
    try:
        ns = {}
        with open(path) as f:
            exec(f.read(), ns)  # a two-line file written by our own CMakeLists.txt
        return ns.get("torch_version")
    except OSError:
        return None


def load_cores():
    """Loads the extension in this process (no statistics segment of its own) and lists the visible cores.

    Returns (cores, error): cores is a list of dicts, error a message if torch or the extension failed."""
    os.environ["NEURON_RT_STATS"] = "0"
    try:
        import torch
        import torch_neuronx._backend as backend

        backend.load()
        n = torch.neuron.device_count()
        cores = []
        for i in range(n):
            p = torch.neuron.get_device_properties(i)
            free, total = torch.neuron.mem_get_info(i)
            first = p.physical_index * p.physical_cores
            cores.append({"index": i, "name": p.name, "physical_index": p.physical_index, "chip": p.chip,
                          "physical_cores": list(range(first, first + p.physical_cores)),
                          "nc_config": p.physical_cores, "capacity": total})
        return cores, None
    except Exception as e:  # noqa: BLE001 - reported to the user, with its type
        return [], f"{type(e).__name__}: {e}" + (f" ({e.__cause__})" if e.__cause__ else "")


def check() -> list:
    """Problems of this set-up, each {"problem", "detail", "fix"}; empty when all is well."""
    problems = []
    ext = extension_path()
    if ext is None:
        problems.append({"problem": "extension not built",
                         "detail": f"no torch_neuronx/_C*.so in {PKG_DIR}",
                         "fix": "make build (checkout) or pip install --no-build-isolation ."})
    built = built_torch_version()
    try:
        installed = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is None:
        problems.append({"problem": "torch not installed", "detail": "", "fix": "pip install torch==2.13.0"})
    elif built is not None and ext is not None and installed.split("+")[0] != built.split("+")[0]:
        problems.append({"problem": "torch version mismatch",
                         "detail": f"the extension was built for torch {built}, torch {installed} is installed",
                         "fix": f"pip install torch=={built.split('+')[0]}, or rebuild the extension"})
    if _ORIG_ENV.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
        problems.append({"problem": "autoload disabled",
                         "detail": "TORCH_DEVICE_BACKEND_AUTOLOAD=0: `import torch` does not load the neuron device",
                         "fix": "unset TORCH_DEVICE_BACKEND_AUTOLOAD, or `import torch_neuronx` explicitly"})
    elif not any(ep.name == "torch_neuronx" for ep in importlib.metadata.entry_points(group="torch.backends")):
        problems.append({"problem": "autoload not registered",
                         "detail": "no torch.backends entry point torch_neuronx: the package is not installed",
                         "fix": "pip install --no-build-isolation ."})
    if ext is not None and installed is not None and not any(p["problem"] == "torch version mismatch"
                                                             for p in problems):
        # Load in a child: a failing load can leave this process half set up.
        env = dict(_ORIG_ENV, TORCH_DEVICE_BACKEND_AUTOLOAD="0", NEURON_RT_STATS="0")
        code = "import torch, torch_neuronx; torch.ones(1, device='neuron')"
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
            msg = lines[-1] if lines else f"exit status {r.returncode}"
            bad = [v for v in ENV_VARS if v.startswith("NEURON_") and v in msg]
            if bad:
                problems.append({"problem": f"bad {bad[0]} value", "detail": msg,
                                 "fix": f"fix or unset {bad[0]} (see README, Environment variables)"})
            else:
                problems.append({"problem": "the extension does not load", "detail": msg, "fix": ""})
    return problems
