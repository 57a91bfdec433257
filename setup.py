"""Builds torch_neuronx._C with CMake (C runtime + kernels + the C++ binding) against the installed torch.

Use ``pip install --no-build-isolation [-e] .`` or ``pip wheel --no-build-isolation .``: the extension
must be built against the exact torch that is installed in the environment, not one from an isolated
build environment.
"""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
# NEURON_CMAKE_BUILD_DIR: another build tree, e.g. for a Python other than the checkout's .venv (a CMake
# tree is tied to one interpreter; switching re-configures and rebuilds everything).
BUILD_DIR = os.environ.get("NEURON_CMAKE_BUILD_DIR") or os.path.join(ROOT, "build", "cmake")
# The extension is written into the checkout's package unless the tree is another one: then into its own folder.
OUT_DIR = os.path.join(BUILD_DIR, "out") if os.environ.get("NEURON_CMAKE_BUILD_DIR") else os.path.join(ROOT, "torch_neuronx")


def _cmake() -> str:
    """cmake on PATH, else the one installed next to this Python (the `cmake` package of a venv that is
    not activated: `.venv/bin/pip install .`)."""
    beside = os.path.join(os.path.dirname(sys.executable), "cmake")
    return shutil.which("cmake") or (beside if os.path.exists(beside) else "cmake")


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        cmake = _cmake()
        subprocess.check_call([cmake, "-S", ROOT, "-B", BUILD_DIR, f"-DPython3_EXECUTABLE={sys.executable}",
                               "-DCMAKE_BUILD_TYPE=Release", f"-DNEURON_OUTPUT_DIR={OUT_DIR}"])
        subprocess.check_call([cmake, "--build", BUILD_DIR, "--target", "_C", "-j", jobs])
        built = [f for f in os.listdir(OUT_DIR) if f.startswith("_C.") and f.endswith(".so")]
        if not built:
            raise RuntimeError("CMake did not produce torch_neuronx/_C*.so")
        target = self.get_ext_fullpath(ext.name)
        source = os.path.join(OUT_DIR, built[0])
        if os.path.abspath(target) != os.path.abspath(source):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(source, target)
            # The torch this build used, for `python -m torch_neuronx check` (after build_py's copy, if any).
            shutil.copy2(os.path.join(OUT_DIR, "_build_info.py"), os.path.join(os.path.dirname(target), "_build_info.py"))


setup(ext_modules=[Extension("torch_neuronx._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
