"""The caching allocator as users see it: statistics, empty_cache, out-of-memory."""
import pytest
import torch

MiB = 1 << 20


def test_stats_return_to_zero_and_empty_cache():
    torch.neuron.empty_cache()
    base = torch.neuron.memory_allocated(1)
    xs = [torch.empty(n, device="neuron:1") for n in (1, 1000, 300_000, 5_000_000)]
    assert torch.neuron.memory_allocated(1) >= base + 4 * (1 + 1000 + 300_000 + 5_000_000)
    assert torch.neuron.memory_reserved(1) >= torch.neuron.memory_allocated(1)
    peak = torch.neuron.max_memory_allocated(1)
    stats = torch.neuron.memory_stats(1)
    assert stats["allocation.all.current"] >= 4
    assert stats["allocated_bytes.small_pool.current"] > 0 and stats["allocated_bytes.large_pool.current"] > 0
    assert stats["reserved_bytes.all.current"] == torch.neuron.memory_reserved(1)
    del xs
    assert torch.neuron.memory_allocated(1) == base
    assert torch.neuron.max_memory_allocated(1) == peak
    assert torch.neuron.memory_reserved(1) > 0  # cached
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved(1) == 0 if base == 0 else True
    torch.neuron.reset_peak_memory_stats(1)
    assert torch.neuron.max_memory_allocated(1) == base
    free, total = torch.neuron.mem_get_info(1)
    assert 0 < free <= total == torch.neuron.get_device_properties(1).total_memory


def test_accelerator_memory_api():
    x = torch.empty(1024, device="neuron")
    assert torch.accelerator.memory.memory_allocated(0) >= 4096
    assert torch.accelerator.memory.memory_stats(0)["allocated_bytes.all.current"] >= 4096
    del x


def test_caching_reuses_blocks():
    torch.neuron.empty_cache()
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron:2")
    ptr = x.data_ptr()
    del x
    y = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron:2")
    assert y.data_ptr() == ptr
    assert torch.neuron.memory_stats(2)["num_device_alloc"] >= 1


def test_out_of_memory_is_clean(python):
    code = r"""
import torch
torch.neuron.set_per_process_memory_fraction(1.0)
total = torch.neuron.get_device_properties(0).total_memory
keep = torch.ones(64 << 20, dtype=torch.uint8, device='neuron')   # 64 MiB live
try:
    torch.empty(total, dtype=torch.uint8, device='neuron')
except torch.OutOfMemoryError as e:
    print('OOM:', e)
s = torch.neuron.memory_stats()
print('ooms', s['num_ooms'], 'allocated', torch.neuron.memory_allocated())
more = torch.ones(32 << 20, dtype=torch.uint8, device='neuron')
print('sum', int(keep.sum().item() + more.sum().item()))
del keep, more
torch.neuron.empty_cache()
print('after', torch.neuron.memory_allocated(), torch.neuron.memory_reserved())
"""
    r = python(code, env={"NEURON_RT_MEMORY_PER_CORE": "1G"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "OOM:" in out and "1073741824 bytes" in out  # names the requested bytes
    assert "free" in out
    assert "ooms 1 allocated 67108864" in out
    assert f"sum {(64 << 20) + (32 << 20)}" in out
    assert "after 0 0" in out


def test_capacity_env_and_fraction(python):
    r = python("import torch; print(torch.neuron.get_device_properties(0).total_memory); "
               "torch.neuron.set_per_process_memory_fraction(0.5); print(torch.neuron.mem_get_info()[1])",
               env={"NEURON_RT_MEMORY_PER_CORE": "512M"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(512 << 20), str(256 << 20)]
