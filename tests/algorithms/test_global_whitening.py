"""Batch whitening over data-parallel ranks: two real gloo processes, each holding half of the
groups, give exactly the advantages one process computes over the concatenated batch
(REINFORCE++, REINFORCE++-baseline, GDPO), and agree on the all-constant early exit."""

import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from easyvideor1.algorithms import ADVANTAGES, AlgorithmConfig
from easyvideor1.distributed import all_reduce_floats

WHITENED = ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "gdpo"]
N, T, WORLD = 8, 5, 2  # 4 groups of 2; rank r holds responses [4r, 4r + 4)


def batch(constant: bool) -> dict:
    """The whole step's batch; its halves differ in lengths, rewards and KL penalties."""
    g = torch.Generator().manual_seed(7)
    lengths = torch.tensor([5, 3, 1, 4, 2, 2, 5, 1])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    acc = torch.ones(N) if constant else (torch.rand(N, generator=g) > 0.5).float()
    fmt = torch.ones(N) if constant else (torch.rand(N, generator=g) > 0.3).float()
    kl = None if constant else 0.05 * torch.rand(N, T, generator=g)
    return dict(rewards=acc + fmt, group_ids=torch.arange(N) // 2, response_mask=mask, kl_penalty=kl,
                reward_parts={"accuracy": acc, "format": fmt})


def rows(inputs: dict, lo: int, hi: int) -> dict:
    out = {}
    for k, v in inputs.items():
        if isinstance(v, dict):
            out[k] = {kk: vv[lo:hi] for kk, vv in v.items()}
        else:
            out[k] = None if v is None else v[lo:hi]
    return out


def advantages(inputs: dict, **extra) -> dict[str, torch.Tensor]:
    kwargs = AlgorithmConfig().estimator_kwargs()
    return {name: ADVANTAGES[name](**inputs, **kwargs, **extra) for name in WHITENED}


def _worker(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        per = N // WORLD
        results = {c: advantages(rows(batch(c), rank * per, (rank + 1) * per), all_reduce_floats=all_reduce_floats)
                   for c in (False, True)}
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_whiten_like_one_process_over_the_whole_batch(tmp_path):
    ctx = mp.start_processes(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 300
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the ranks did not finish: mismatched collectives?")
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for constant in (False, True):
        whole = advantages(batch(constant))  # one process, every response
        per_rank = {c: advantages(rows(batch(constant), r * 4, r * 4 + 4)) for c, r in (("r0", 0), ("r1", 1))}
        for name in WHITENED:
            joined = torch.cat([parts[r][constant][name] for r in range(WORLD)])
            # float64 statistics, float32 output: equal up to the order of the float64 sums
            torch.testing.assert_close(joined, whole[name], rtol=1e-6, atol=1e-6, msg=f"{name} constant={constant}")
            if constant:
                assert torch.all(joined == 0), name
            else:  # the check has teeth: whitening each half alone gives other numbers
                local = torch.cat([per_rank["r0"][name], per_rank["r1"][name]])
                assert not torch.allclose(local, whole[name], atol=1e-3), name
