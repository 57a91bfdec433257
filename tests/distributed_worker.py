"""Worker run by tests/test_distributed.py under torchrun: `python -m torch.distributed.run
--nproc_per_node=N tests/distributed_worker.py <scenario>`. Every check compares against values each rank
computes by itself from the rank numbers; a failed check raises, which makes torchrun fail."""

import faulthandler
import os
faulthandler.enable()
faulthandler.dump_traceback_later(float(os.environ.get("NEURON_DIST_TEST_DEADLINE", "150")), exit=True)
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
DEV = torch.device("neuron", int(os.environ.get("LOCAL_RANK", "0")))

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
ALL = FLOATS + INTS + [torch.bool]
SIZES = [7, 70001]  # staged through the workspace / read in place from device memory


def log(*a):
    print(f"[rank {RANK}]", *a, flush=True)


def make(rank, n, dtype, salt=0):
    """Rank `rank`'s input: small values so sums and products stay exact."""
    g = torch.Generator().manual_seed(1000 * rank + 17 * n + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randint(-8, 9, (n,), generator=g).double() / 4).to(dtype)
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, (n,), generator=g).to(dtype)


def expected_reduce(inputs, op, dtype, factors=None):
    if dtype == torch.bool:
        stack = torch.stack(inputs)
        return (stack.any(0) if op in ("SUM", "MAX") else stack.all(0))
    acc_t = torch.float64 if dtype == torch.float64 else (torch.float32 if dtype.is_floating_point else torch.int64)
    xs = [x.to(acc_t) for x in inputs]
    if op == "PREMUL_SUM":
        acc = xs[0] * torch.tensor(factors[0], dtype=acc_t)
        for x, f in zip(xs[1:], factors[1:]):
            acc = acc + x * torch.tensor(f, dtype=acc_t)
        return acc.to(dtype)
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in ("SUM", "AVG"):
            acc = acc + x
        elif op == "PRODUCT":
            acc = acc * x
        elif op == "MIN":
            acc = torch.minimum(acc, x)
        else:
            acc = torch.maximum(acc, x)
    if op == "AVG":
        acc = acc / len(xs) if dtype.is_floating_point else torch.div(acc, len(xs), rounding_mode="trunc")
    return acc.to(dtype)


def check_equal(got, want, what, atol=0.0):
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{what}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
    if atol == 0.0:
        ok = torch.equal(got, want)
    else:
        ok = torch.allclose(got.double(), want.double(), atol=atol, rtol=1e-3)
    if not ok:
        bad = (got.double() - want.double()).abs().argmax().item() if got.numel() else 0
        raise AssertionError(f"{what}: mismatch at {bad}: got {got.flatten()[bad]}, want {want.flatten()[bad]}")


REDOPS = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.AVG, "PRODUCT": dist.ReduceOp.PRODUCT,
          "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX}


def redop(name, factor):
    return dist.ReduceOp.PREMUL_SUM(factor) if name == "PREMUL_SUM" else REDOPS[name]


def ops_for(dtype):
    ops = ["SUM", "PRODUCT", "MIN", "MAX"]
    if dtype != torch.bool:
        ops.append("AVG")
    if dtype.is_floating_point:
        ops.append("PREMUL_SUM")
    return ops


def gloo_path(device):
    return str(device) == "cpu" or os.environ.get("TORCH_NEURONX_DIST_FORCE_GLOO", "0") == "1"


def check_all_reduce(device):
    count = 0
    for dtype in ALL:
        if dtype == torch.int16 and gloo_path(device):
            continue  # Gloo has no int16 (as with PyTorch's own Gloo groups)
        for n in SIZES:
            for op in ops_for(dtype):
                factors = [0.5 * (r + 1) for r in range(WORLD)]
                x = make(RANK, n, dtype).to(device)
                dist.all_reduce(x, op=redop(op, factors[RANK]))
                want = expected_reduce([make(r, n, dtype) for r in range(WORLD)], op, dtype, factors)
                # Gloo (CPU tensors, forced Gloo) has no AVG/PREMUL_SUM: emulated with a second rounding
                emulated = op == "PREMUL_SUM" or (op == "AVG" and gloo_path(device))
                half = dtype in (torch.float16, torch.bfloat16)
                tol = 1e-2 if emulated and half else 0.0
                if gloo_path(device) and half and op == "PRODUCT" and WORLD > 2:
                    tol = 0.1  # Gloo rounds each partial product to 16 bits (|products| <= 2 ** WORLD)
                check_equal(x, want, f"all_reduce {op} {dtype} n={n} on {device}", atol=tol)
                count += 1
    return count


def check_other_collectives(device):
    n_checks = 0
    root = WORLD - 1
    for dtype in [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool,
                  torch.complex64]:
        if gloo_path(device) and dtype in (torch.bool, torch.complex64):
            continue  # not every Gloo collective takes these (as with PyTorch's own Gloo groups)
        for n in SIZES:
            mk = (lambda r, salt=0: torch.complex(make(r, n, torch.float32, salt), make(r, n, torch.float32, salt + 1))
                  if dtype == torch.complex64 else make(r, n, dtype, salt))
            inputs = [mk(r) for r in range(WORLD)]
            # broadcast
            x = inputs[RANK].clone().to(device)
            dist.broadcast(x, src=root)
            check_equal(x, inputs[root], f"broadcast {dtype} n={n}")
            # all_gather (list) and all_gather_into_tensor
            outs = [torch.empty(n, dtype=dtype, device=device) for _ in range(WORLD)]
            dist.all_gather(outs, inputs[RANK].to(device))
            for r in range(WORLD):
                check_equal(outs[r], inputs[r], f"all_gather {dtype} n={n} piece {r}")
            big = torch.empty(WORLD * n, dtype=dtype, device=device)
            dist.all_gather_into_tensor(big, inputs[RANK].to(device))
            check_equal(big, torch.cat(inputs), f"all_gather_into_tensor {dtype} n={n}")
            # all_to_all_single with uneven splits: rank q sends (q + r + 1) rows to rank r
            send_splits = [RANK + r + 1 for r in range(WORLD)]
            recv_splits = [q + RANK + 1 for q in range(WORLD)]
            rows = lambda q, r: mk(q, 100 + r)[: (q + r + 1)]  # noqa: E731
            send = torch.cat([rows(RANK, r) for r in range(WORLD)]).to(device)
            recv = torch.empty(sum(recv_splits), dtype=dtype, device=device)
            dist.all_to_all_single(recv, send, recv_splits, send_splits)
            check_equal(recv, torch.cat([rows(q, RANK) for q in range(WORLD)]), f"all_to_all_single {dtype}")
            # all_to_all (lists)
            outs = [torch.empty(q + RANK + 1, dtype=dtype, device=device) for q in range(WORLD)]
            dist.all_to_all(outs, [rows(RANK, r).to(device) for r in range(WORLD)])
            for q in range(WORLD):
                check_equal(outs[q], rows(q, RANK), f"all_to_all {dtype} from {q}")
            # gather / scatter
            g = [torch.empty(n, dtype=dtype, device=device) for _ in range(WORLD)] if RANK == root else None
            dist.gather(inputs[RANK].to(device), g, dst=root)
            if RANK == root:
                for r in range(WORLD):
                    check_equal(g[r], inputs[r], f"gather {dtype} piece {r}")
            s = torch.empty(n, dtype=dtype, device=device)
            pieces = [mk(root, 7 + r) for r in range(WORLD)]
            dist.scatter(s, [p.to(device) for p in pieces] if RANK == root else None, src=root)
            check_equal(s, pieces[RANK], f"scatter {dtype}")
            n_checks += 8
            if dtype in (torch.bool, torch.complex64):
                continue
            # reduce to root; reduce_scatter (list) and reduce_scatter_tensor with SUM/AVG/PREMUL_SUM
            for op in ["SUM", "MAX"]:
                x = inputs[RANK].clone().to(device)
                dist.reduce(x, dst=root, op=REDOPS[op])
                want = expected_reduce(inputs, op, dtype) if RANK == root else inputs[RANK]
                check_equal(x, want, f"reduce {op} {dtype} n={n}")
            for op in ["SUM", "AVG"] + (["PREMUL_SUM"] if dtype.is_floating_point else []):
                factors = [1.0 / WORLD] * WORLD
                chunks = [[make(q, n, dtype, 50 + r) for r in range(WORLD)] for q in range(WORLD)]
                out = torch.empty(n, dtype=dtype, device=device)
                dist.reduce_scatter(out, [c.to(device) for c in chunks[RANK]], op=redop(op, factors[RANK]))
                want = expected_reduce([chunks[q][RANK] for q in range(WORLD)], op, dtype, factors)
                emulated = op == "PREMUL_SUM" or (op == "AVG" and gloo_path(device))
                tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) and emulated else 0.0
                check_equal(out, want, f"reduce_scatter {op} {dtype} n={n}", atol=tol)
                out2 = torch.empty(n, dtype=dtype, device=device)
                dist.reduce_scatter_tensor(out2, torch.cat(chunks[RANK]).to(device), op=redop(op, factors[RANK]))
                check_equal(out2, want, f"reduce_scatter_tensor {op} {dtype} n={n}", atol=tol)
                n_checks += 2
    # send/recv in a ring with isend/irecv, then blocking send/recv
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for n in SIZES:
        a = make(RANK, n, torch.float32, 3).to(device)
        b = torch.empty(n, device=device)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, a, nxt), dist.P2POp(dist.irecv, b, prv)])
        for req in reqs:
            req.wait()
        check_equal(b, make(prv, n, torch.float32, 3), "batch_isend_irecv")
        if RANK == 0:
            dist.send(a, dst=1)
        elif RANK == 1:
            dist.recv(b, src=0)
            check_equal(b, make(0, n, torch.float32, 3), "send/recv")
    # coalesced all_reduce, async work with a timeout and a future
    ts = [make(RANK, n, torch.float32, 9).to(device) for n in (5, 70001, 3)]
    dist.all_reduce_coalesced(ts)
    for t, n in zip(ts, (5, 70001, 3)):
        check_equal(t, expected_reduce([make(r, n, torch.float32, 9) for r in range(WORLD)], "SUM", torch.float32),
                    "all_reduce_coalesced")
    x = make(RANK, 100, torch.float32).to(device)
    work = dist.all_reduce(x, async_op=True)
    assert work.wait(timeout=timedelta(seconds=30))
    fut = work.get_future()
    check_equal(fut.wait()[0], expected_reduce([make(r, 100, torch.float32) for r in range(WORLD)], "SUM",
                                               torch.float32), "future value")
    return n_checks + 5


def check_objects_and_barriers():
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK, "s": "x" * RANK})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(WORLD)], objs
    lst = [RANK, f"from {RANK}"]
    dist.broadcast_object_list(lst, src=WORLD - 1)
    assert lst == [WORLD - 1, f"from {WORLD - 1}"], lst
    out = [None] * WORLD if RANK == 0 else None
    dist.gather_object(("g", RANK), out, dst=0)
    if RANK == 0:
        assert out == [("g", r) for r in range(WORLD)], out
    got = [None]
    dist.scatter_object_list(got, [("s", r) for r in range(WORLD)] if RANK == 0 else None, src=0)
    assert got[0] == ("s", RANK), got
    dist.barrier()
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)


def expect_error(fn, *needles):
    """fn must raise on this rank, naming every needle; returns the message."""
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        missing = [n for n in needles if n not in msg]
        assert not missing, (missing, msg)
        return msg
    raise AssertionError(f"no error; expected one naming {needles}")


def check_mismatch():
    """Ranks that disagree on a collective: every rank raises at once, naming the operation and each side's
    count, shape and dtype (from the header exchanged at the start of every call); the group survives."""
    last = WORLD - 1
    # Different sizes (staged on rank 0, in place in device memory on the others).
    shape = (10, 100) if RANK == 0 else (100000,)
    expect_error(lambda: dist.all_reduce(torch.ones(shape, device=DEV)), "mismatched", "all_reduce",
                 "count=1000, shape=[10, 100]", "count=100000, shape=[100000]", "dtype=float32")
    # Different dtypes, both large.
    dt = torch.bfloat16 if RANK == last else torch.float32
    expect_error(lambda: dist.all_reduce(torch.ones(70001, device=DEV, dtype=dt)), "dtype=bfloat16",
                 "dtype=float32")
    expect_error(lambda: dist.broadcast(torch.ones(4, device=DEV, dtype=torch.float32 if RANK else torch.int32),
                                        src=0), "broadcast", "dtype=int32", "dtype=float32")
    # all_gather_into_tensor whose inputs differ by one element; reduce_scatter with different reduce ops.
    n = 70001 if RANK == last else 70000
    expect_error(lambda: dist.all_gather_into_tensor(torch.empty(WORLD * n, device=DEV),
                                                     torch.ones(n, device=DEV)),
                 "all_gather", "count=70000, shape=[70000]", "count=70001, shape=[70001]")
    op = dist.ReduceOp.MAX if RANK == last else dist.ReduceOp.SUM
    expect_error(lambda: dist.reduce_scatter_tensor(torch.empty(8, device=DEV), torch.ones(8 * WORLD, device=DEV),
                                                    op=op), "reduce_scatter", "op=SUM", "op=MAX")
    # Different collectives.
    expect_error(lambda: (dist.broadcast(torch.ones(5, device=DEV), src=0) if RANK == last
                          else dist.all_reduce(torch.ones(5, device=DEV))), "all_reduce(", "broadcast(")
    # Arguments that one rank rejects before the collective starts (an output of the wrong size): that rank
    # still takes part in the call's start, flagged, so the others fail at once too.
    out_n = WORLD * 8 + (1 if RANK == last else 0)
    msg = expect_error(lambda: dist.all_gather_into_tensor(torch.empty(out_n, device=DEV),
                                                           torch.ones(8, device=DEV)), "all_gather_into_tensor")
    assert ("elements" in msg) if RANK == last else (f"rank {last} could not take part" in msg), msg
    # all_to_all_single where rank 0 expects fewer rows than rank 1 sends
    recv = torch.empty(2 * WORLD - (1 if RANK == 0 else 0), device=DEV)
    splits = [2] * WORLD
    if RANK == 0:
        splits[1] = 1
    expect_error(lambda: dist.all_to_all_single(recv, torch.ones(2 * WORLD, device=DEV), splits, [2] * WORLD),
                 "expects")
    x = torch.ones(3, device=DEV)
    dist.all_reduce(x)
    check_equal(x, torch.full((3,), float(WORLD)), "all_reduce after a mismatch")


def check_split_mesh():
    """A group bound to a device (init_process_group(device_id=...)) makes DeviceMesh sub-groups by splitting."""
    from torch.distributed.device_mesh import init_device_mesh

    rows = 2 if WORLD % 2 == 0 else 1
    mesh = init_device_mesh("neuron", (rows, WORLD // rows), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        group = mesh[dim].get_group()
        members = dist.get_process_group_ranks(group)
        assert RANK in members, (dim, members)
        x = torch.full((70001,), float(RANK + 1), device=DEV)
        dist.all_reduce(x, group=group)
        check_equal(x, torch.full((70001,), float(sum(r + 1 for r in members))), f"all_reduce on mesh dim {dim}")
        cpu = torch.full((3,), float(RANK + 1))
        dist.all_reduce(cpu, group=group)  # CPU tensors on the split group: its Gloo
        check_equal(cpu, torch.full((3,), float(sum(r + 1 for r in members))), f"CPU all_reduce on {dim}")


def scenario_collectives():
    dist.init_process_group(device_id=DEV)  # bare: the default backend for neuron
    assert dist.get_backend() == "neuron", dist.get_backend()
    import torch_neuronx.distributed as nd

    shm = nd.is_shared_memory()
    assert shm == (os.environ.get(nd.FORCE_GLOO_ENV, "0") != "1")
    t0 = time.time()
    n = check_all_reduce(DEV)
    n += check_other_collectives(DEV)
    n += check_all_reduce("cpu")  # CPU tensors on the neuron group: Gloo
    check_objects_and_barriers()
    check_split_mesh()
    if shm:
        check_mismatch()
    dist.destroy_process_group()
    log(f"OK collectives: {n} checked in {time.time() - t0:.1f}s (shared memory: {shm})")


class MLP(torch.nn.Module):
    def __init__(self, d=16, h=32):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def data(steps, batch, d=16):
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(batch * WORLD, d, generator=g), torch.randn(batch * WORLD, d, generator=g))
            for _ in range(steps)]


def reference_training(steps, batch, lr=0.1):
    """Single-process training on the full batch; per-step losses on every rank's shard."""
    torch.manual_seed(0)
    model = MLP().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in data(steps, batch):
        x, y = x.to(DEV), y.to(DEV)
        with torch.no_grad():
            shard = slice(RANK * batch, (RANK + 1) * batch)
            losses.append(torch.nn.functional.mse_loss(model(x[shard]), y[shard]).item())
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model, losses


def scenario_training():
    dist.init_process_group("neuron")
    steps, batch = 4, 8
    ref, ref_losses = reference_training(steps, batch)

    # DDP
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(MLP().to(DEV), device_ids=None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data(steps, batch):
        shard = slice(RANK * batch, (RANK + 1) * batch)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[shard].to(DEV)), y[shard].to(DEV)).backward()
        opt.step()
    for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
        check_equal(p.detach(), q.detach().cpu(), f"DDP parameter {name}", atol=1e-5)
    log("OK DDP")

    # FSDP2 on a neuron device mesh
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("neuron", (WORLD,))
    torch.manual_seed(0)
    model = MLP().to(DEV)
    fully_shard(model.fc1, mesh=mesh)
    fully_shard(model.fc2, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in data(steps, batch):
        shard = slice(RANK * batch, (RANK + 1) * batch)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[shard].to(DEV)), y[shard].to(DEV))
        losses.append(loss.item())
        loss.backward()
        opt.step()
    assert all(abs(a - b) <= 1e-5 * (1 + abs(b)) for a, b in zip(losses, ref_losses)), (losses, ref_losses)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        check_equal(p.full_tensor().detach(), q.detach().cpu(), f"FSDP2 parameter {name}", atol=1e-5)
    log(f"OK FSDP2 losses {losses}")

    # DTensor tensor parallel: colwise fc1, rowwise fc2
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(1)
    plain = MLP().to(DEV)
    torch.manual_seed(1)
    tp = parallelize_module(MLP().to(DEV), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(7)).to(DEV)
    out_ref, out_tp = plain(x), tp(x)
    check_equal(out_tp.detach(), out_ref.detach().cpu(), "TP forward", atol=1e-5)
    out_ref.square().sum().backward()
    out_tp.square().sum().backward()
    for (name, p), q in zip(tp.named_parameters(), plain.parameters()):
        check_equal(p.grad.full_tensor(), q.grad.cpu(), f"TP grad {name}", atol=1e-5)
    log("OK TP")

    # DTensor random ops: shards draw from one Philox stream, so the whole tensor matches no matter
    # how it is sharded, and shards differ between ranks.
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.manual_seed(5)
    a = distribute_tensor(torch.empty(8, 6, device=DEV), mesh, [Shard(0)]).uniform_()
    torch.manual_seed(5)
    b = distribute_tensor(torch.empty(8, 6, device=DEV), mesh, [Replicate()]).uniform_()
    full_a = a.full_tensor().cpu()
    assert not torch.equal(full_a[:4], full_a[4:]), "DTensor shards drew the same random numbers"
    check_equal(full_a, b.full_tensor().cpu(), "DTensor uniform_ sharded vs replicated")
    log("OK DTensor random")
    dist.destroy_process_group()
    log("OK training")


def scenario_dead_peer():
    """The last rank exits without a word, between collectives ("between") or at a random point inside a
    stream of large all_reduces ("inside"); the others raise well within the group timeout."""
    import threading

    mode = sys.argv[2] if len(sys.argv) > 2 else "between"
    dist.init_process_group("neuron", timeout=timedelta(seconds=60))
    x = torch.ones(4 * 1024 * 1024, device=DEV)
    dist.all_reduce(x)
    if RANK == WORLD - 1:
        if mode == "between":
            time.sleep(0.5)
            os._exit(0)
        threading.Timer(0.3, os._exit, (0,)).start()
        while True:
            dist.all_reduce(x)
    t0 = time.time()
    calls = 0
    try:
        while True:  # "between": the first call fails; "inside": whichever call the peer died in
            dist.all_reduce(x)
            calls += 1
            t0 = time.time()
    except RuntimeError as e:
        elapsed = time.time() - t0
        assert "exited" in str(e) or "aborted" in str(e), str(e)
        assert elapsed < 30, elapsed
        log(f"OK dead peer raised after {calls} calls, {elapsed:.2f}s into the failing one: {e}")
        os._exit(0)


def scenario_killed_peer():
    """Started by the test without torchrun (whose agent would stop every rank once one dies); the test sends
    SIGKILL to the last rank while all ranks stream large all_reduces and reduce_scatters. The others must raise
    within the group timeout and then exit normally, as a user's script would."""
    dist.init_process_group("neuron", timeout=timedelta(seconds=60))
    x = torch.ones(4 * 1024 * 1024, device=DEV)
    out = torch.empty(x.numel() // WORLD, device=DEV)
    dist.all_reduce(x)
    log("READY")
    calls, t0 = 0, time.time()
    try:
        while True:
            dist.all_reduce(x) if calls % 2 == 0 else dist.reduce_scatter_tensor(out, x)
            x.fill_(1.0)
            calls += 1
            t0 = time.time()
    except RuntimeError as e:
        elapsed = time.time() - t0
        assert "exited" in str(e) or "aborted" in str(e), str(e)
        log(f"OK killed peer raised after {calls} calls, {elapsed:.2f}s into the failing one: {e}")
    faulthandler.cancel_dump_traceback_later()
    sys.exit(0)


PROMPTS = ["The future of AI is", "A language model reads text"]
NEW_TOKENS = 12


def _inputs(tok):
    tok.padding_side = "left"
    return tok.apply_chat_template([[{"role": "user", "content": p}] for p in PROMPTS], add_generation_prompt=True,
                                   padding=True, return_tensors="pt")


def _generate(model, tok):
    """Static-cache greedy generation as users write it; also the logits of the prompt's next token."""
    from transformers import GenerationConfig

    enc = _inputs(tok)
    # Transformers compiles static-cache generation on neuron (Inductor, minutes on a loaded 2-core
    # machine); NEURON_DIST_TEST_COMPILE=1 runs that, the default runs the same graph eagerly.
    cfg = GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                           cache_implementation="static", max_cache_len=128, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id,
                           disable_compile=os.environ.get("NEURON_DIST_TEST_COMPILE", "0") != "1")
    dev = model.device
    out = model.generate(enc["input_ids"].to(dev), attention_mask=enc["attention_mask"].to(dev), generation_config=cfg)
    return out.cpu(), _next_logits(model, enc["attention_mask"], out[:, : enc["input_ids"].shape[1]].cpu())


def _next_logits(model, prompt_mask, seqs):
    """float32 logits of the token after each row of seqs (left-padded prompts continued by generation)."""
    mask = torch.cat([prompt_mask, torch.ones(seqs.shape[0], seqs.shape[1] - prompt_mask.shape[1],
                                              dtype=prompt_mask.dtype)], 1)
    with torch.no_grad():
        out = model(seqs.to(model.device), attention_mask=mask.to(model.device)).logits[:, -1]
    return out.float().cpu()


def _first_divergence(a, b):
    """(row, position) of the first token where generations a and b differ, or None."""
    for row in range(a.shape[0]):
        diff = (a[row] != b[row]).nonzero()
        if len(diff):
            return row, int(diff[0])
    return None


def scenario_tp_generate():
    """Transformers tensor parallelism as users write it, on a neuron device mesh; rank 0 compares the tokens
    with a single-device neuron run and a CPU run of the same checkpoint, in float32 and bfloat16.

    float32: the tokens must be identical. bfloat16: a row-split matmul rounds each rank's partial product to
    bfloat16 before the all-reduce adds them, so TP logits differ from one device's by bfloat16 rounding
    (single-device neuron and CPU differ from each other the same way: other summation orders). Tokens must
    then be identical up to a first divergence, if any, that is a near-tie: on the common prefix, both chosen
    tokens' float32 logits differ by no more than the two runs' own bfloat16 logit errors there (if run A picks
    a and run B picks b while each is within e_A, e_B of the float32 logits l, then |l[a] - l[b]| <= e_A + e_B).
    A real bug shows as a logit error far beyond bfloat16 rounding, which the first-step check catches."""
    from torch.distributed.device_mesh import DeviceMesh
    from transformers import AutoModelForCausalLM, AutoTokenizer, DistributedConfig

    mesh = DeviceMesh("neuron", list(range(WORLD)))
    for path in sys.argv[2:]:
        name = os.path.basename(path)
        tok = AutoTokenizer.from_pretrained(path)
        prompt_mask = _inputs(tok)["attention_mask"]
        ref32 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32) if RANK == 0 else None
        for dtype in (torch.float32, torch.bfloat16):
            tp_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_mesh=mesh,
                                                            distributed_config=DistributedConfig(tp_size=WORLD))
            assert tp_model.device == DEV and type(tp_model.model.layers[0].mlp.down_proj.weight).__name__ == "DTensor"
            tp, tp_logits = _generate(tp_model, tok)
            runs, models = {"tp": (tp, tp_logits)}, {"tp": tp_model}
            if RANK == 0:
                for dev in ("neuron", "cpu"):
                    models[dev] = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=dev)
                    runs[dev] = _generate(models[dev], tok)
                log(f"{name} {dtype}: {tok.batch_decode(tp[:, -NEW_TOKENS:])!r}")
            # Pairs that differ: every rank takes part in the TP forward on the common prefix.
            todo = [None]
            if RANK == 0:
                todo = [[(a, b, _first_divergence(runs[a][0], runs[b][0])) for a, b in
                         (("tp", "neuron"), ("tp", "cpu"), ("neuron", "cpu"))]]
            dist.broadcast_object_list(todo, src=0)
            for a, b, where in todo[0]:
                if where is None:
                    continue
                row, pos = where
                assert dtype == torch.bfloat16, f"{name} float32: {a} and {b} differ at row {row}, position {pos}"
                prefix = tp[row : row + 1, :pos]
                got = {k: _next_logits(m, prompt_mask[row : row + 1], prefix)[0] for k, m in models.items()}
                if RANK != 0:
                    continue
                exact = _next_logits(ref32, prompt_mask[row : row + 1], prefix)[0]
                ta, tb = int(runs[a][0][row, pos]), int(runs[b][0][row, pos])
                err_a, err_b = (got[a] - exact).abs().max().item(), (got[b] - exact).abs().max().item()
                gap = abs(exact[ta] - exact[tb]).item()
                log(f"{name} bf16 {a} vs {b}: first difference at row {row} position {pos} ({ta} vs {tb}); "
                    f"float32 logit gap {gap:.4g} <= bf16 errors {err_a:.4g} + {err_b:.4g}")
                assert gap <= err_a + err_b, (name, a, b, row, pos, gap, err_a, err_b)
            if RANK == 0:
                exact = _next_logits(ref32, prompt_mask, runs["tp"][0][:, : prompt_mask.shape[1]])
                err = {k: (v[1] - exact).abs().max().item() for k, v in runs.items()}
                log(f"{name} {dtype}: first-step logit error vs CPU float32: {err}")
                if dtype == torch.float32:
                    assert max(err.values()) < 1e-4, err
                else:  # TP's bfloat16 error is of the size of one device's (it rounds partial sums once more)
                    assert err["tp"] <= 2 * max(err["neuron"], err["cpu"]), err
            del tp_model, models
            dist.barrier()
    dist.destroy_process_group()
    log("OK tp generate")


if __name__ == "__main__":
    torch.neuron.set_device(DEV)
    {"collectives": scenario_collectives, "training": scenario_training,
     "dead_peer": scenario_dead_peer, "killed_peer": scenario_killed_peer, "tp_generate": scenario_tp_generate}[sys.argv[1]]()
