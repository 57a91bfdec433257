"""The launch post's Qwen-Image 2.1 example (tensor parallelism + compiled repeated blocks), changed only in the
model path (a tiny local pipeline: `python examples/make_tiny_diffusers.py /tmp/tiny-qwen-image-2.1`), the mesh
size (every rank of the job), the resolution and the step count:

    torchrun --nproc_per_node=2 examples/diffusers_tp.py [/tmp/tiny-qwen-image-2.1]
"""
import sys
import torch, torch.distributed as dist, torch_neuronx # TP
from torch.distributed.device_mesh import DeviceMesh # TP
from diffusers import QwenImage21Pipeline, QwenImage21Transformer2DModel, TensorParallelConfig

# Distributed devices initialization
dist.init_process_group(backend="neuron") # TP
dev = torch.neuron.current_device()
mesh = DeviceMesh("neuron", list(range(dist.get_world_size()))) # TP=world size

# Pipeline initialization
model = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny-qwen-image-2.1"
transformer = QwenImage21Transformer2DModel.from_pretrained(
    model,
    subfolder="transformer",
    torch_dtype=torch.bfloat16,
    parallel_config=TensorParallelConfig(mesh=mesh), # TP
)
pipe = QwenImage21Pipeline.from_pretrained(
    model,
    transformer=transformer,
    torch_dtype=torch.bfloat16,
)
pipe.vae.to(dev)
pipe.transformer.compile_repeated_blocks(backend="neuron", fullgraph=True, dynamic=False)

# Image generation
emb, mask, _ = pipe.encode_prompt(prompt="A capybara wearing a wizard hat, oil painting", device="cpu")  # text encoder stays on CPU
image = pipe(
    prompt_embeds=emb.to(dev),
    prompt_embeds_mask=mask.to(dev) if mask is not None else None,
    height=64,
    width=64,
    num_inference_steps=2,
    generator=torch.Generator("cpu").manual_seed(0), # same noise on every rank
).images[0]
if dist.get_rank() == 0:
    image.save("out.png")
