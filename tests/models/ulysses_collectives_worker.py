"""One process of tests/models/test_ulysses.py::test_collectives_round_trip (torchrun, gloo, any
world size): the head/sequence all-to-all and the collectives with gradients, against tensors
every rank can build whole; then `distributed.close`: one gloo worker thread per group, and once
it returns no worker thread holds a tensor of a finished collective (the exit-time abort it
prevents: `easyvideor1/distributed.py`). Exits non-zero on the first mismatch."""

import os
import weakref

import torch
import torch.distributed as dist

from easyvideor1 import distributed
from easyvideor1.models.ulysses import SequenceParallel, heads_to_seq, seq_to_heads
from easyvideor1.training.fsdp import init_distributed


def main():
    rank, world, _ = init_distributed()
    sp = SequenceParallel(distributed.new_subgroups(world), rank, world)
    heads, length, dim = 2 * world, 3 * world, 5
    g = torch.Generator().manual_seed(0)
    whole = torch.randn(1, heads, length, dim, generator=g)  # the same on every rank
    weight = torch.randn(1, heads, length, dim, generator=g)
    per_seq, per_head = length // world, heads // world
    mine = whole[:, :, rank * per_seq:(rank + 1) * per_seq].clone().requires_grad_(True)

    # all tokens of this rank's heads
    by_heads = seq_to_heads(mine, sp)
    assert torch.equal(by_heads, whole[:, rank * per_head:(rank + 1) * per_head]), "seq_to_heads layout"
    back = heads_to_seq(by_heads, sp)
    assert torch.equal(back, mine), "heads_to_seq(seq_to_heads(x)) != x"
    # gradient of sum over ranks of <w, seq_to_heads(x)>: w at this rank's tokens, every head
    (by_heads * weight[:, rank * per_head:(rank + 1) * per_head]).sum().backward()
    assert torch.equal(mine.grad, weight[:, :, rank * per_seq:(rank + 1) * per_seq]), "all_to_all gradient"

    # all_gather_grad: backward sums the ranks' gradients of my block
    x = torch.full((2, 3), float(rank + 1), requires_grad=True)
    gathered = distributed.all_gather_grad(x, sp.group)  # [world, 2, 3]
    assert torch.equal(gathered[:, 0, 0], torch.arange(1, world + 1, dtype=torch.float32)), "all_gather order"
    scale = torch.arange(world, dtype=torch.float32)[:, None, None] + 10 * rank  # rank-dependent upstream grads
    (gathered * scale).sum().backward()
    expected = sum(rank + 10 * r for r in range(world))  # sum over ranks r of scale_r[block=rank]
    assert torch.all(x.grad == expected), (x.grad, expected)

    # all_reduce_grad: the value and the gradient are sums over the ranks
    y = torch.tensor([float(rank + 1)], requires_grad=True)
    total = distributed.all_reduce_grad(y, sp.group)
    assert total.item() == world * (world + 1) / 2
    (total * (rank + 1)).sum().backward()
    assert y.grad.item() == world * (world + 1) / 2

    # a collective as FSDP2 issues them: the caller drops its handle and tensor once woken, while
    # the worker thread may still hold them (and would take the GIL to free them, at exit too)
    tensor = torch.ones(8)
    work = dist.all_reduce(tensor, async_op=True, group=sp.group)
    work.wait()
    freed = weakref.ref(tensor)
    del tensor, work
    workers = [t for t in os.listdir("/proc/self/task") if open(f"/proc/self/task/{t}/comm").read().strip() ==
               "pt_gloo_runloop"]
    assert len(workers) == 2, f"{len(workers)} gloo worker threads for 2 groups (the world, sp): one each"
    distributed.close()
    assert freed() is None, "a gloo worker thread still holds a finished collective's tensor after close"
    assert not distributed.is_initialized()
    print(f"rank {rank}: ok")


if __name__ == "__main__":
    main()
