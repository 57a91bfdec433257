"""Settings of the neuron code generator (``_inductor.py``).

Registered with Inductor as the device's codegen config, so their values are part of every FX graph and
AOTAutograd cache key of a neuron graph: a persistent cache written by a wrapper generator that emitted
other code is never loaded by this one.
"""

import hashlib
import os
import sys

from torch.utils._config_module import install_config_module

# Version of the Python wrapper code the neuron backend generates. 1: generated kernels run inside
# profiler ranges while torch.profiler records. 2: the graph's code runs under a guard of its device
# (3: a private guard class; 4: torch.neuron.device again, made as cheap). 5: cat lowered as on CPU (a
# ConcatKernel, not one masked pointwise loop). 6: right pads not lowered as cat, as on CPU.
wrapper_version: int = 6


def _lowering_digest() -> str:
    # The lowering patches (_inductor.py) and the random-number prims (_rng_prims.py) decide the code a graph
    # compiles to, beside the wrapper. A cached graph from an earlier version of them was served after they
    # changed (an argmax over a permuted input kept returning the memory-order index from the cache), so their
    # source is part of every cache key, not only a version number someone must remember to raise.
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in ("_inductor.py", "_rng_prims.py"):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


lowering_digest: str = _lowering_digest()

install_config_module(sys.modules[__name__])
