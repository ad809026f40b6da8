"""Every collective the package issues, in one place, on the process group's device.

An NCCL group only takes CUDA tensors; gloo takes CPU tensors. Code elsewhere never builds a
tensor for `torch.distributed` itself: it calls these helpers, which put the tensor on
`collective_device()` and bring the result back. In one process (no group, or a group of one)
every helper is the identity, so the same code runs unchanged on a laptop.

Decisions that change how many collectives follow (skip a sample, stop filtering, retry)
are made with `all_true` / `any_true` / `max_int`, so every rank takes the same path.

Joining and leaving (`init_process_group`, `close`): on CPUs the groups are gloo groups with
ONE worker thread each (backend `gloo_serial`; torch's `gloo` has two), and `close` ends each
group this package made with one last all-reduce whose work and tensor it keeps until the
process ends. Why: a gloo worker thread drops its reference to each collective's work after the
caller has been woken, and if that was the last one it frees the work's tensors there; under
torch 2.13 freeing a tensor that has a Python object takes the GIL (`TensorImpl::decref_pyobject`).
If the process is already finalising, CPython 3.11 ends that thread with `pthread_exit`, whose
unwinding through the noexcept destructor calls `std::terminate`: "terminate called without an
active exception", SIGABRT, exit 134, after all the work was written (pytorch#190489,
pytorch#38228; `destroy_process_group` stops gloo's threads only when no Python reference to
the group is left, and FSDP2 modules and DTensor's caches keep them). A barrier does not end
it: gloo's barrier work holds (weak) references to the works queued before it and frees them
when it is itself freed, on the worker thread, after waking the caller (a core dump of such an
abort: `~AsyncBarrierWork` -> `~AsyncAllgatherCoalescedWork` -> `decref_pyobject` -> `take_gil`
-> `pthread_exit` -> `std::terminate`). An all-reduce holds no other work; with one worker per
group it runs after every earlier work of the group has been freed, and the caller keeps the
last reference to it, so once it returns no gloo thread will need the GIL again.
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

_ACCELERATOR_BACKENDS = {"nccl": "cuda", "xccl": "xpu", "hccl": "npu"}
CPU_BACKEND = "gloo_serial"  # gloo, one worker thread per group (module docstring)
_JOINED: list[Any] = []  # the groups this package made on this rank, in creation order: None (the world) first
_KEPT: list[Any] = []  # `close`'s last work and tensor of each group: freed at exit by this thread, not gloo's
_WAITING: dict[float, Any] = {}  # `waiting_group`'s groups of this world, by timeout in minutes


def _gloo_serial(opts: Any, _backend_options: Any) -> Any:
    """A gloo backend with one worker thread (torch's `gloo` devices: GLOO_SOCKET_IFNAME or the host's)."""
    return serial_gloo_group(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                             list(opts.global_ranks_in_group), opts.group_id)


def serial_gloo_group(store: Any, rank: int, size: int, timeout: timedelta,
                      global_ranks: list[int] | None = None, name: str = "") -> Any:
    """A gloo process group with one worker thread (module docstring), on `store`; also for groups
    made outside `torch.distributed`'s world (the asynchronous trainer and its rollout process)."""
    gloo = dist.ProcessGroupGloo
    options = gloo._Options()
    options._timeout = timeout
    names = os.environ.get("GLOO_SOCKET_IFNAME")
    options._devices = ([gloo.create_device(interface=n) for n in names.split(",")] if names
                        else [gloo.create_default_device()])
    options._threads = 1
    options.global_ranks_in_group = global_ranks if global_ranks is not None else list(range(size))
    options.group_name = name
    return gloo(store, rank, size, options)


def _register_cpu_backend() -> None:
    if CPU_BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(CPU_BACKEND, _gloo_serial, extended_api=True, devices=["cpu"])


def init_process_group(backend: str, **kwargs: Any) -> None:
    """`torch.distributed.init_process_group`, with `CPU_BACKEND` known (`backend`: "nccl" and
    its kin on accelerators, `CPU_BACKEND` on CPUs). Leave with `close`."""
    if backend == CPU_BACKEND:
        _register_cpu_backend()
    dist.init_process_group(backend, **kwargs)
    _JOINED[:] = [None]  # (forgets the groups of an earlier world left without `close`)
    _WAITING.clear()


def launched() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) torchrun gave this process: every launched process, whatever group it
    joins; (0, 1) without torchrun."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


@functools.cache
def launch_store() -> Any:
    """The store torchrun's rendezvous gives this process (`env://`: MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE), once per process. Separate rollout placement builds its worlds on it
    (`training.asynchronous`): the trainer ranks' default group and the weight pair, each under a
    prefix of its own."""
    store, _, _ = next(dist.rendezvous("env://"))
    return store


def waiting_group(minutes: float) -> Any:
    """A CPU group of every rank (`CPU_BACKEND`) whose collectives time out after `minutes`,
    for waiting while other ranks do long work (a checkpoint write) without running into the
    NCCL groups' watchdog. None in one process. Made on first use: every rank calls it at the
    same point (creating a group is collective)."""
    if not is_distributed():
        return None
    if minutes not in _WAITING:
        _register_cpu_backend()
        _WAITING[minutes] = dist.new_group(backend=CPU_BACKEND, timeout=timedelta(minutes=minutes))
        if _JOINED:  # in a world of ours: `close` leaves it
            _JOINED.append(_WAITING[minutes])
    return _WAITING[minutes]


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def is_distributed(group: Any = None) -> bool:
    """A process group of more than one rank is active."""
    return is_initialized() and dist.get_world_size(group) > 1


def rank(group: Any = None) -> int:
    return dist.get_rank(group) if is_initialized() else 0


def world_size(group: Any = None) -> int:
    return dist.get_world_size(group) if is_initialized() else 1


def collective_device(group: Any = None) -> torch.device:
    """The device the group's backend takes tensors on: the current accelerator for NCCL (and
    its kin), the CPU for gloo."""
    if not is_initialized():
        return torch.device("cpu")
    kind = _ACCELERATOR_BACKENDS.get(str(dist.get_backend(group)))
    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    if kind is not None:
        return torch.device(kind, getattr(torch, kind).current_device())
    return torch.device("cpu")


_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def all_reduce(tensor: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:
    """`tensor` reduced over the ranks (`op`: sum, max or min), on `tensor`'s own device.

    The input is not modified; gradients do not flow through.
    """
    if not is_distributed(group):
        return tensor.detach().clone()
    buf = tensor.detach().to(collective_device(group), copy=True)
    dist.all_reduce(buf, op=getattr(dist.ReduceOp, _OPS[op]), group=group)
    return buf.to(tensor.device)


def all_reduce_floats(values: list[float], op: str = "sum", group: Any = None) -> list[float]:
    """Each float reduced over the ranks (float64, one collective for the whole list)."""
    if not is_distributed(group):
        return [float(v) for v in values]
    return all_reduce(torch.tensor(values, dtype=torch.float64), op, group).tolist()


def max_int(value: int, group: Any = None) -> int:
    """The largest `value` over the ranks."""
    if not is_distributed(group):
        return int(value)
    return int(all_reduce(torch.tensor([int(value)], dtype=torch.long), "max", group).item())


def all_true(flag: bool, group: Any = None) -> bool:
    """True when `flag` holds on every rank."""
    if not is_distributed(group):
        return bool(flag)
    return bool(all_reduce(torch.tensor([int(bool(flag))], dtype=torch.long), "min", group).item())


def any_true(flag: bool, group: Any = None) -> bool:
    """True when `flag` holds on at least one rank."""
    if not is_distributed(group):
        return bool(flag)
    return bool(all_reduce(torch.tensor([int(bool(flag))], dtype=torch.long), "max", group).item())


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order; `[obj]` in one process.

    torch pickles into a tensor on the group's device (it needs `torch.cuda.set_device` under
    NCCL, which `training.fsdp.init_distributed` does)."""
    if not is_distributed(group):
        return [obj]
    parts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, obj, group=group)
    return parts


def barrier(group: Any = None) -> None:
    if is_distributed(group):
        dist.barrier(group=group)


def new_subgroups(size: int) -> Any:
    """Split the world into groups of `size` consecutive ranks; return this rank's group (None in
    one process)."""
    world = world_size()
    if world % size:
        raise ValueError(f"{world} processes cannot be split into groups of {size}")
    return _my_group([list(range(first, first + size)) for first in range(0, world, size)])


def strided_subgroups(stride: int) -> Any:
    """Groups of the ranks equal modulo `stride` ({r, r + stride, ...}); this rank's (None in
    one process). Under sequence parallelism of size `stride` these are the data-parallel
    replicas: one rank of each sequence-parallel group."""
    world = world_size()
    if world % stride:
        raise ValueError(f"{world} processes cannot be strided by {stride}")
    return _my_group([list(range(first, world, stride)) for first in range(stride)])


def _my_group(rank_lists: list[list[int]]) -> Any:
    """Create a group per list (every rank creates every group, in the same order, as
    `torch.distributed` requires); return the one holding this rank (None in one process)."""
    if not is_initialized():
        return None
    mine = None
    for ranks in rank_lists:
        group = dist.new_group(ranks)
        if rank() in ranks:
            mine = group
    if mine is not None and _JOINED:  # in a world of ours: `close` leaves it
        _JOINED.append(mine)
    return mine


# Collectives with gradients (sequence parallelism): each backward is the forward's adjoint, so
# the backward of the k ranks together is the gradient of the sum of their losses.

class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _all_to_all(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad.contiguous(), ctx.group), None


def _all_to_all(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    buf = tensor.to(collective_device(group)).contiguous()
    out = torch.empty_like(buf)
    dist.all_to_all_single(out, buf, group=group)
    return out.to(tensor.device)


def all_to_all(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Block j of `tensor` (split in world-size equal blocks along dim 0) goes to rank j; the
    result's block j came from rank j. Gradients flow (backward: the same exchange)."""
    if not is_distributed(group):
        return tensor
    if tensor.shape[0] % world_size(group):
        raise ValueError(f"all_to_all: dim 0 ({tensor.shape[0]}) must divide by the group size {world_size(group)}")
    return _AllToAll.apply(tensor, group)


# torch 2.13 renamed them (the old names warn); older torch has only the old names
_ALL_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        buf = tensor.to(collective_device(group)).contiguous()
        out = buf.new_empty((world_size(group) * buf.shape[0], *buf.shape[1:]))  # gloo: blocks along dim 0
        _ALL_GATHER(out, buf, group=group)
        return out.view(world_size(group), *buf.shape).to(tensor.device)

    @staticmethod
    def backward(ctx, grad):
        buf = grad.to(collective_device(ctx.group)).contiguous()
        out = buf.new_empty(buf.shape[1:])
        _REDUCE_SCATTER(out, buf.flatten(0, 1), group=ctx.group)
        return out.to(grad.device), None


def all_gather_grad(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """[world, *shape]: every rank's `tensor` (same shape, >= 1 dim, on each), in rank order, with gradients
    (backward: the gradients summed over the ranks, each rank keeping its own block)."""
    if not is_distributed(group):
        return tensor[None]
    return _AllGather.apply(tensor, group)


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return all_reduce(tensor, "sum", group)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, "sum", ctx.group), None


def all_reduce_grad(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """`tensor` summed over the ranks, with gradients (backward: the gradients summed too)."""
    if not is_distributed(group):
        return tensor
    return _AllReduceSum.apply(tensor, group)


def close() -> None:
    """Leave every process group (the sub-groups too) once every rank is done: one last
    all-reduce on the world, then on each sub-group in creation order (so no rank waits on a
    group its peers have not reached), whose work and tensor stay referenced here until the
    process ends, then `destroy_process_group`. Under `CPU_BACKEND` no gloo worker thread then
    frees a tensor, so the process can end without the abort of the module docstring. Call it on
    every rank after the last collective (`cli.main` does, after any command); a no-op unless
    `init_process_group` made the world (a world vLLM or a test made is theirs to leave)."""
    if not (_JOINED and is_initialized()):
        _JOINED.clear()
        _WAITING.clear()
        return
    for group in _JOINED:  # a group of one rank too: its worker thread also frees works
        done = torch.zeros(1, device=collective_device(group))
        work = dist.all_reduce(done, group=group, async_op=True)
        work.wait()
        _KEPT.append((work, done))
    _JOINED.clear()
    _WAITING.clear()
    dist.destroy_process_group()
