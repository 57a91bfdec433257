"""Builds a tiny random Qwen-Image 2.1 pipeline (or another kind) from configs and saves it with save_pretrained,
for examples/diffusers_tp.py and the tests. No network: the text encoder is a 2-layer Qwen3-VL with a byte-level
BPE tokenizer trained in process.

    python examples/make_tiny_diffusers.py /tmp/tiny-qwen-image-2.1 [--kind qwenimage21] [--layers 2]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torch_neuronx.testing import tiny_diffusers  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path")
    p.add_argument("--kind", default="qwenimage21", choices=tiny_diffusers.KINDS)
    p.add_argument("--layers", type=int, default=2)
    a = p.parse_args()
    tiny_diffusers.make(a.kind, a.path, layers=a.layers)
    print(f"saved a tiny {a.kind} pipeline to {a.path}")


if __name__ == "__main__":
    main()
