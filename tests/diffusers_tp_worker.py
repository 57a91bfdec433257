"""Worker run by tests/test_diffusers.py under torchrun: tensor parallelism of a tiny local Qwen-Image 2.1
transformer, the way the launch post's example does it, in the variants the example does not cover.

    torchrun --nproc_per_node=N tests/diffusers_tp_worker.py <model dir> <out dir> <float32|bfloat16>
        <eager|compiled> <pretrained|in_memory>

pretrained: `from_pretrained(..., parallel_config=TensorParallelConfig(mesh=...))`, which streams each rank's
slices off disk. in_memory: the whole model loaded on CPU first, then `enable_parallelism(config=...)` (diffusers'
neuron path pre-shards each weight on CPU). Each rank counts the collectives issued while the weights are placed
(there must be none), measures its peak device memory against the transformer's full weights, and saves its image
as .npy for the test to compare.
"""
import contextlib
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils._python_dispatch import TorchDispatchMode

import torch_neuronx  # noqa: F401
from diffusers import QwenImage21Pipeline, QwenImage21Transformer2DModel, TensorParallelConfig


class CollectiveCounter(TorchDispatchMode):
    """Counts every collective dispatched (c10d's and the functional ones DTensor uses)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ns = func.namespace
        if ns in ("c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional"):
            self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def local_bytes(module):
    total = 0
    for p in module.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        total += t.numel() * t.element_size()
    return total


def sharded_bytes(module):
    """(bytes this rank holds, bytes of the whole tensors) of the parameters sharded across the mesh."""
    from torch.distributed.tensor import DTensor, Shard

    local = whole = 0
    for p in module.parameters():
        if isinstance(p, DTensor) and any(isinstance(pl, Shard) for pl in p.placements):
            local += p.to_local().numel() * p.element_size()
            whole += p.numel() * p.element_size()
    return local, whole


def main():
    model_dir, out_dir, dtype_name, mode, load = sys.argv[1:6]
    dtype = getattr(torch, dtype_name)
    dist.init_process_group(backend="neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.neuron.current_device()
    mesh = DeviceMesh("neuron", list(range(world)))
    config = TensorParallelConfig(mesh=mesh)

    full = QwenImage21Transformer2DModel.from_pretrained(model_dir, subfolder="transformer", torch_dtype=dtype)
    full_bytes = local_bytes(full)
    torch.neuron.reset_peak_memory_stats(dev)
    base = torch.neuron.memory_allocated(dev)
    counter = CollectiveCounter()
    with counter:
        if load == "pretrained":
            del full
            transformer = QwenImage21Transformer2DModel.from_pretrained(
                model_dir, subfolder="transformer", torch_dtype=dtype, parallel_config=config)
        else:
            transformer = full
            transformer.enable_parallelism(config=config)
            transformer.to(dev)  # the planned weights are on the device now; the rest (embedders, norms) follows
    load_peak = torch.neuron.max_memory_allocated(dev) - base
    resident = local_bytes(transformer)
    shard_local, shard_whole = sharded_bytes(transformer)

    pipe = QwenImage21Pipeline.from_pretrained(model_dir, transformer=transformer, torch_dtype=dtype)
    pipe.vae.to(dev)
    if mode == "compiled":
        pipe.transformer.compile_repeated_blocks(backend="neuron", fullgraph=True, dynamic=False)
    emb, mask, _ = pipe.encode_prompt(prompt="A capybara wearing a wizard hat, oil painting", device="cpu")
    torch.neuron.reset_peak_memory_stats(dev)
    # The forward's all_reduces show that the counter sees collectives at all (eager only: Dynamo does not
    # trace under a user dispatch mode).
    run_counter = CollectiveCounter()
    with run_counter if mode == "eager" else contextlib.nullcontext():
        image = pipe(prompt_embeds=emb.to(dev), prompt_embeds_mask=mask.to(dev) if mask is not None else None,
                     height=64, width=64, num_inference_steps=2, generator=torch.Generator("cpu").manual_seed(0),
                     output_type="np").images[0]
    run_peak = torch.neuron.max_memory_allocated(dev) - base
    np.save(os.path.join(out_dir, f"image_rank{rank}.npy"), image)
    report = {"rank": rank, "world": world, "weight_collectives": counter.calls, "run_collectives": len(run_counter.calls), "full_weight_bytes": full_bytes,
              "resident_weight_bytes": resident,
              "sharded_local_bytes": shard_local, "sharded_whole_bytes": shard_whole, "load_peak_bytes": load_peak, "run_peak_bytes": run_peak,
              "vae_bytes": local_bytes(pipe.vae)}
    with open(os.path.join(out_dir, f"report_rank{rank}.json"), "w") as f:
        json.dump(report, f)
    print(f"[rank {rank}] TP={world} {dtype_name} {mode} {load}: transformer weights {full_bytes / 2**20:.2f} MiB, "
          f"resident on this rank {resident / 2**20:.2f} MiB ({resident / full_bytes:.2f} of them; of the "
          f"{shard_whole / 2**20:.2f} MiB of sharded weights it holds {shard_local / max(shard_whole, 1):.3f}), "
          f"peak device memory while loading {load_peak / 2**20:.2f} MiB, while generating {run_peak / 2**20:.2f} "
          f"MiB; collectives while loading: {len(counter.calls)}, "
          f"while generating: {len(run_counter.calls)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
