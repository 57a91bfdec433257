"""Settings of the neuron code generator (``_inductor.py``).

Registered with Inductor as the device's codegen config, so their values are part of every FX graph and
AOTAutograd cache key of a neuron graph: a persistent cache written by a wrapper generator that emitted
other code is never loaded by this one.
"""

import sys

from torch.utils._config_module import install_config_module

# Version of the Python wrapper code the neuron backend generates. 1: generated kernels run inside
# profiler ranges while torch.profiler records. 2: the graph's code runs under a guard of its device
# (3: a private guard class; 4: torch.neuron.device again, made as cheap). 5: cat lowered as on CPU (a
# ConcatKernel, not one masked pointwise loop). 6: right pads not lowered as cat, as on CPU.
wrapper_version: int = 6

install_config_module(sys.modules[__name__])
