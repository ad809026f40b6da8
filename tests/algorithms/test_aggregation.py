"""Loss aggregation: hand values, and the same gradient whatever the micro-batch split and the
number of (simulated) data-parallel ranks."""

import pytest
import torch

from easyvideor1.algorithms import (
    AGGREGATIONS,
    POLICY_LOSSES,
    AlgorithmConfig,
    LossInputs,
    aggregate,
    loss_normalizer,
    normalizer_count,
    normalizer_from_counts,
)


def call_loss(name, *, cfg, normalizer, kl_coef=None, **inputs):
    """A policy loss with keyword inputs, called as `training.update` calls it (a `LossInputs`)."""
    return POLICY_LOSSES[name](LossInputs(**inputs), cfg, normalizer, kl_coef=kl_coef)


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), float("inf")]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize("mode, expect", [
    ("token_mean", (1 + 2 + 3 + 4) / 4),
    ("seq_mean_token_mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),
    ("seq_mean_token_sum", ((1 + 2 + 3) + 4) / 2),
    ("seq_mean_token_sum_norm", (1 + 2 + 3 + 4) / (2 * 5)),  # max_len 5
])
def test_hand_values(mode, expect):
    norm = loss_normalizer(MASK, mode, max_len=5)
    assert aggregate(LOSS, MASK, mode, norm).item() == pytest.approx(expect)


def test_counts_and_guards():
    masks = [MASK, torch.zeros(2, 4), torch.tensor([[0, 1]])]
    assert normalizer_count(masks, "token_mean") == 5  # 4 + 0 + 1
    assert normalizer_count(masks, "seq_mean_token_mean") == 3  # empty rows do not count
    assert normalizer_count(masks, "seq_mean_token_sum_norm", max_len=7) == 21
    assert normalizer_from_counts([6.0, 2.0]) == 4.0  # global 8 over 2 ranks
    assert loss_normalizer(torch.zeros(2, 3), "token_mean") == 1.0  # empty mini-batch stays finite
    with pytest.raises(ValueError, match="max_len"):
        loss_normalizer(MASK, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="token_mean, seq_mean_token_mean"):
        loss_normalizer(MASK, "seq_mean")
    with pytest.raises(RuntimeError, match="torch.distributed"):
        loss_normalizer(MASK, "token_mean", all_reduce=True)


def test_empty_mask_gives_zero_loss_and_zero_grad():
    x = torch.randn(2, 3, requires_grad=True)
    for mode in AGGREGATIONS:
        out = aggregate(x, torch.zeros(2, 3), mode, 1.0)
        out.backward()
        assert out.item() == 0.0 and torch.all(x.grad == 0)


# ---- micro-batch and data-parallel invariance on a tiny log-linear policy ----
N, T, V, H = 8, 6, 5, 4
LENGTHS = [6, 1, 3, 5, 2, 6, 4, 1]
MAX_LEN = 6


def make_batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, T, H, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (N, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).long()
    old = torch.randn(N, T, generator=g, dtype=torch.float64) * 0.3 - 1.5
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    ref = old - 0.2
    return x, tokens, mask, old, adv, ref


def grads(cfg, batches, normalizer, weight):
    """Accumulated gradient of the policy weight over micro-batches (each trimmed to its own width)."""
    weight.grad = None
    for x, tokens, mask, old, adv, ref in batches:
        width = int(mask.sum(-1).max())
        x, tokens, mask, old, ref = x[:, :width], tokens[:, :width], mask[:, :width], old[:, :width], ref[:, :width]
        logits = x @ weight  # [n, w, V]
        log_dists = torch.log_softmax(logits, -1)
        lp = log_dists.gather(-1, tokens[..., None])[..., 0]  # [n, w]
        entropy = -(log_dists.exp() * log_dists).sum(-1)  # [n, w]
        loss, _ = call_loss(cfg.policy_loss, log_probs=lp, old_log_probs=old, advantages=adv, response_mask=mask,
                                                 cfg=cfg, normalizer=normalizer, entropy=entropy, ref_log_probs=ref)
        loss.backward()
    return weight.grad.clone()


def split(batch, sizes):
    """Consecutive parts of the given sizes (uneven, as token-budget micro-batching makes them)."""
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
    assert bounds[-1] == batch[0].shape[0]
    return [tuple(t[a:b] for t in batch) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@pytest.mark.parametrize("mode", list(AGGREGATIONS))
@pytest.mark.parametrize("loss_name", ["ppo_clip", "gspo"])
def test_same_gradient_for_any_micro_batch_split_and_rank_count(mode, loss_name):
    cfg = AlgorithmConfig(policy_loss=loss_name, loss_agg_mode=mode, use_kl_loss=True, kl_coef=0.1,
                          entropy_coef=0.01, clip_ratio_low=0.2, clip_ratio_high=0.28)
    weight = torch.randn(H, V, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    batch = make_batch()
    full = grads(cfg, [batch], loss_normalizer(batch[2], mode, max_len=MAX_LEN), weight)

    micro = split(batch, [1, 3, 2, 2])
    norm = loss_normalizer([mb[2] for mb in micro], mode, max_len=MAX_LEN)
    assert torch.allclose(grads(cfg, micro, norm, weight), full, atol=1e-12)

    ranks = split(batch, [3, 5])  # 2 simulated ranks, micro-batches of 2 / [2, 3]; all-reduce averages
    rank_micro = [split(ranks[0], [2, 1]), split(ranks[1], [2, 3])]
    counts = [normalizer_count([mb[2] for mb in r], mode, max_len=MAX_LEN) for r in rank_micro]
    norm = normalizer_from_counts(counts)
    per_rank = [grads(cfg, r, norm, weight) for r in rank_micro]
    assert torch.allclose(sum(per_rank) / 2, full, atol=1e-12)

    # the upstream way (each micro-batch normalised by its own count) is not invariant
    naive = sum(grads(cfg, [mb], loss_normalizer(mb[2], mode, max_len=MAX_LEN), weight) for mb in micro) / 4
    assert not torch.allclose(naive, full, atol=1e-6)


def _all_reduce_worker(rank: int, init_file: str, out_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    mask = torch.ones(1, 3) if rank == 0 else torch.tensor([[1, 0, 0], [1, 1, 0]])  # 3 and 3 tokens
    norm = loss_normalizer(mask, "token_mean", all_reduce=True)
    if rank == 0:
        with open(out_file, "w") as f:
            f.write(str(norm))
    dist.destroy_process_group()


@pytest.mark.timeout(600)  # ends a hang (e.g. a rank stuck in the collective) only
def test_all_reduce_path_with_two_real_processes(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "norm.txt"
    mp.start_processes(_all_reduce_worker, args=(str(tmp_path / "init"), str(out)), nprocs=2, start_method="fork")
    assert float(out.read_text()) == pytest.approx((3 + 3) / 2)  # global tokens / ranks
