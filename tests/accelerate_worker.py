"""A plain Accelerate training loop (bf16 mixed precision, dropout) with save_state / load_state resume, for
tests/test_accelerate_flow.py.

    accelerate launch tests/accelerate_worker.py full|resume|resume_reseeded <checkpoint dir> <result.json>

full: 8 steps, save_state after step 4. resume: load_state, skip the 4 batches seen, train steps 5-8.
resume_reseeded: as resume, then reseeds the neuron generator (a control: the dropout masks then differ).
The loader shuffles with its own seeded generator, so the data order does not depend on the global RNG state.
"""
import json
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

STEPS, SAVE_AT = 8, 4
mode, ckpt, out = sys.argv[1:4]
acc = Accelerator(mixed_precision="bf16")
set_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Dropout(0.25), torch.nn.Linear(64, 1))
g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(128, 16, generator=g), torch.randn(128, 1, generator=g))
loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, opt, loader = acc.prepare(model, opt, loader)
if mode != "full":
    acc.load_state(ckpt)
if mode == "resume_reseeded":
    torch.neuron.manual_seed_all(1234)
if mode != "full":
    batches, start = acc.skip_first_batches(loader, SAVE_AT), SAVE_AT
else:
    batches, start = loader, 0
model.train()
losses = []
for step, (x, y) in enumerate(batches, start=start):
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    losses.append(acc.gather(loss.detach()[None]).cpu().tolist())
    if mode == "full" and step + 1 == SAVE_AT:
        acc.save_state(ckpt)
    if step + 1 == STEPS:
        break
if acc.is_main_process:
    json.dump({"device": str(acc.device), "type": str(acc.distributed_type), "mp": acc.mixed_precision,
               "losses": losses, "neuron_rng": torch.neuron.get_rng_state().sum().item()}, open(out, "w"))
print(f"rank {acc.process_index} on {acc.device} ({acc.distributed_type}, {acc.mixed_precision}): {losses}",
      flush=True)
