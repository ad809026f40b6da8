"""Padding-free rows in the trainer's log-prob passes (`training.padding_free`): every response
token's log-prob, entropy, exact KL and gradient equal those of the padded path.

Tiny models of every family, float32, through `training.sequences.forward_logprobs` (what the old,
reference and full-KL passes and the update call); the batch of `test_shared_prefix` (video,
image, text and video+image prompts, groups of unequal size, responses of unequal length, one
empty). Micro-batches of 2 (video only, image + text, text only: both dummies), 3 (groups cut
across micro-batches) and 10 (everything in one row), with the group-shared prefix off and on.
Qwen3.5's linear-attention layers restart per block (`models.linear_attention`; its own tests:
test_linear_attention.py). The gradient test runs Qwen3-VL-MoE too, replaying an engine's routes
(`test_shared_prefix.engine_routes`) as the trainer does: packed rows carry them at each sequence's span.
"""

from __future__ import annotations

import pytest
import torch
from test_shared_prefix import DENSE, _batch, engine_routes, replay, unreplayed_gap

from easyvideor1.algorithms import AlgorithmConfig
from easyvideor1.models.collate import collate
from easyvideor1.models.inputs import append_response
from easyvideor1.models.loading import load_policy
from easyvideor1.models.lora import ReferenceView, apply_lora
from easyvideor1.models.packing import PACKED_ATTENTION, language_attention, packing_blocker, use_packed_attention
from easyvideor1.models.routing import release
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.models.logprobs import sequence_logprobs
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.training.sequences import ForwardContext, collate_responses, forward_logprobs, micro_batches
from easyvideor1.training.update import policy_update
from step_gradients import one_step_gradients, record_step_gradients

# Same tokens, same weights; only the attention shapes (one SDPA per sequence vs a padded [B, L]
# SDPA) and so the float32 summation order differ: measured <= 4.8e-7 on log-probs (|log p| ~ 7),
# <= 2.9e-6 on entropies, <= 5.2e-7 on the exact KL (~0.1). A packed row whose sequences see each
# other (the same row on plain SDPA) moves log-probs by 0.06-0.17 on these models.
LOGPROB_TOL = 1e-5
# Gradients reach ~10 here; float32 order moved them by <= 1.4e-6 absolute (2 layers + the tower).
# atol 1e-5 is 1e-6 of the largest; sequences that see each other move 2e5 elements past it.
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5


def _ctx(tiny, packed: bool, micro: int, shared: bool = False) -> ForwardContext:
    return ForwardContext(tiny.family, tiny.spec, tiny.pad_id, micro_batch_size=micro, temperature=1.0,
                          chunk_size=7, shared_prefix=shared, padding_free=packed, **replay(tiny))


def _pass(model, tiny, batch, packed: bool, micro: int, shared: bool = False, grad: bool = False, reference=None):
    """Log-probs, entropies, KL to `reference` (or None) [N, T] and, with `grad`, the gradients of a
    loss that weighs every response token differently (so a token scored at the wrong place shows)."""
    model.zero_grad(set_to_none=True)
    parts = []
    for idx in micro_batches(list(range(batch.size)), micro):
        with torch.set_grad_enabled(grad):
            logp, ent, kl = forward_logprobs(model, batch, idx, _ctx(tiny, packed, micro, shared), with_entropy=True,
                                             reference=reference)
        if grad:
            w = torch.arange(1, logp.numel() + 1, dtype=torch.float32).reshape(logp.shape) / logp.numel()
            ((logp * w).sum() + 0.1 * ent.sum()).backward()
            if tiny.family.moe:
                release(model)  # the routes served the backward (as `training.update` does)
        parts.append((logp.detach(), ent.detach(), None if kl is None else kl.detach()))
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None} if grad else {}
    kl = torch.cat([p[2] for p in parts]) if reference is not None else None
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), kl, grads


def _packable(tiny) -> None:
    """Every family packs (Qwen3.5's linear-attention layers too): put the model on packed attention."""
    assert tiny.family.padding_free and packing_blocker(tiny.model.config) is None
    use_packed_attention(tiny.model)  # padded calls still get SDPA (models.packing)


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "shared"])
@pytest.mark.parametrize("micro", [2, 3, 10])
def test_logprobs_and_entropies_equal_the_padded_path(tiny, micro, shared):
    _packable(tiny)
    batch = _batch(tiny)
    padded, padded_ent, _, _ = _pass(tiny.model, tiny, batch, False, micro, shared)
    packed, packed_ent, _, _ = _pass(tiny.model, tiny, batch, True, micro, shared)
    mask = batch.response_mask
    assert mask.sum() > 20 and padded.abs().max() > 1
    diff = (padded - packed)[mask].abs().max()
    assert diff <= LOGPROB_TOL, f"{tiny.family.name}: max |logp diff| {diff:.2e}"
    assert (padded_ent - packed_ent)[mask].abs().max() <= LOGPROB_TOL
    assert torch.all(packed[~mask] == 0)


def test_packed_rows_hold_no_padding(tiny):
    """What the packed path saves: a micro-batch is one row of exactly its real tokens plus the
    masked dummies (one per missing modality), where the padded one computes rows x width."""
    _packable(tiny)
    batch = _batch(tiny)
    for idx in micro_batches(list(range(batch.size)), 2):
        padded = collate_responses(batch, idx, _ctx(tiny, False, 2))
        packed = collate_responses(batch, idx, _ctx(tiny, True, 2))
        real = int(padded.attention_mask.sum())
        dummies = int(((padded.mm_token_type_ids != 0) & (padded.attention_mask == 0)).sum())
        assert packed.input_ids.shape == (1, real + dummies) and packed.attention_mask is None
        assert packed.packing.bounds[-1 - dummies] == real  # the dummies are blocks of one at the end
        assert len(packed.packing.blocks) == len(idx) + dummies


@pytest.mark.parametrize("tiny, checkpointing",
                         [(f, c) for f in DENSE for c in (False, True)] + [("qwen3_vl_moe", False)],
                         ids=lambda v: v if isinstance(v, str) else "checkpointed" if v else "plain", indirect=["tiny"])
def test_gradients_equal_the_padded_path(tiny, tiny_dirs, checkpointing):
    """Groups cut across micro-batches, shared prefix off and on; with gradient checkpointing the
    decoder layers recompute their forward in backward, which must receive the packing too.
    Qwen3-VL-MoE (plain) replays an engine's routes, placed at each sequence's span of a packed row."""
    _packable(tiny)
    model = tiny.model
    if checkpointing:
        model = load_policy(tiny_dirs[tiny.family.name], dtype="float32", gradient_checkpointing=True)
        use_packed_attention(model)
        assert model.is_gradient_checkpointing
    batch = _batch(tiny)
    if tiny.family.moe:
        engine_routes(tiny, batch)
    for shared in (False, True):
        logp, _, _, padded = _pass(model, tiny, batch, False, 3, shared, grad=True)
        _, _, _, packed = _pass(model, tiny, batch, True, 3, shared, grad=True)
        assert set(padded) == set(packed) and any("visual" in n for n in padded)
        if tiny.family.moe:  # the routes are in effect: routed on its own, the model scores otherwise
            assert any(".mlp.experts." in n for n in padded) and unreplayed_gap(tiny, batch, logp) > 1e-3
        for name, g in padded.items():
            torch.testing.assert_close(packed[name], g, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=lambda m: f"{name}: {m}")
    model.zero_grad(set_to_none=True)


def test_policy_update_gradients_equal_the_padded_path(tiny):
    """One `policy_update` (lr 0) per path, ppo_clip with perturbed old log-probs so the clip
    engages and one offline response: the gradients it leaves equal."""
    _packable(tiny)
    batch = _batch(tiny)
    logp, _, _, _ = _pass(tiny.model, tiny, batch, False, 3)
    g = torch.Generator().manual_seed(0)
    mask = batch.response_mask
    batch.old_log_probs = (logp + 0.3 * torch.randn(logp.shape, generator=g)) * mask
    batch.advantages = torch.randn(batch.size, 1, generator=g).expand_as(logp) * mask
    batch.offline[2] = True
    algo = AlgorithmConfig(policy_loss="ppo_clip", loss_agg_mode="token_mean", disable_kl=True)
    grads = {}
    for packed in (False, True):
        optimizer = torch.optim.SGD(tiny.model.parameters(), lr=0.0)
        seen = record_step_gradients(tiny.model, optimizer)
        metrics = policy_update(tiny.model, optimizer, batch, algo, _ctx(tiny, packed, 3), ppo_epochs=1, n_mini=1,
                                grad_clip=1e9, max_len=32, kl_coef=0.0)
        assert metrics["update/skipped_nonfinite"] == 0
        grads[packed] = one_step_gradients(seen)
    assert set(grads[False]) == set(grads[True])
    assert max(float(v.abs().max()) for v in grads[False].values()) > 1e-4
    for name, padded in grads[False].items():  # gradients ~0.1 here (normalised loss): atol 1e-6 of that
        torch.testing.assert_close(grads[True][name], padded, rtol=1e-4, atol=1e-7, msg=lambda m: f"{name}: {m}")
    tiny.model.zero_grad(set_to_none=True)


def test_full_kl_to_a_reference_equals_the_padded_path(tiny, tiny_dirs):
    """`kl_estimator: full`: the reference runs the same packed rows (its own model on packed
    attention); the exact KL per token equals the padded pass's, and is far from 0."""
    _packable(tiny)
    reference = load_policy(tiny_dirs[tiny.family.name], dtype="float32").requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    batch = _batch(tiny)
    mask = batch.response_mask
    _, _, padded, _ = _pass(tiny.model, tiny, batch, False, 3, reference=reference)
    with pytest.raises(ValueError, match="packed attention"):  # the reference still on plain SDPA
        _pass(tiny.model, tiny, batch, True, 3, reference=reference)
    use_packed_attention(reference)
    _, _, packed, _ = _pass(tiny.model, tiny, batch, True, 3, reference=reference)
    assert padded[mask].min() > 1e-2  # ~0.1, and differs from token to token by ~1e-2
    assert (padded - packed)[mask].abs().max() <= LOGPROB_TOL


def test_lora_policy_and_its_reference_view_pack(tiny, tiny_dirs):
    """A LoRA policy (peft layers injected in place) switches to packed attention like the full
    model; its `ReferenceView` shares the config, so the reference pass packs too."""
    _packable(tiny)
    model = load_policy(tiny_dirs[tiny.family.name], dtype="float32")
    apply_lora(model, rank=4, alpha=8.0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B starts at 0: make the adapters matter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    use_packed_attention(model)
    view = ReferenceView(model)
    assert language_attention(view) == PACKED_ATTENTION
    batch = _batch(tiny)
    mask = batch.response_mask
    padded_lp, _, padded_kl, padded_g = _pass(model, tiny, batch, False, 3, grad=True, reference=view)
    packed_lp, _, packed_kl, packed_g = _pass(model, tiny, batch, True, 3, grad=True, reference=view)
    assert (padded_lp - packed_lp)[mask].abs().max() <= LOGPROB_TOL
    # the adapters move the KL far past the tolerance (~8e-3 on the MoE models, whose experts take none)
    assert padded_kl[mask].max() > 1e-2 and (padded_kl - packed_kl)[mask].abs().max() <= LOGPROB_TOL
    assert set(padded_g) == set(packed_g) and all("lora_" in n for n in padded_g)
    for name, grad in padded_g.items():
        torch.testing.assert_close(packed_g[name], grad, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=lambda m: f"{name}: {m}")


def test_generation_is_unchanged_on_packed_attention(tiny, tiny_dirs):
    """The HF rollout engine generates with the very model the trainer packs: without `packing`
    the packed attention is transformers' SDPA, so the tokens and log-probs equal those of the
    same weights on plain SDPA (same shapes, same kernels)."""
    _packable(tiny)
    plain = load_policy(tiny_dirs[tiny.family.name], dtype="float32")
    packed = load_policy(tiny_dirs[tiny.family.name], dtype="float32")
    use_packed_attention(packed)
    assert language_attention(plain) == "sdpa" and language_attention(packed) == PACKED_ATTENTION
    batch = _batch(tiny)
    prompts = batch.prompts
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=0)
    out = {}
    for name, model in (("plain", plain), ("packed", packed)):
        engine = HFEngine(model, tiny.processor, tiny.family, tiny.spec)
        out[name] = engine.generate(prompts, 2, params)
    for a, b in zip(out["plain"], out["packed"]):
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        for ra, rb in zip(a, b):
            torch.testing.assert_close(torch.as_tensor(rb.logprobs), torch.as_tensor(ra.logprobs), rtol=0, atol=1e-6)
    # and a padded training batch gives the same log-probs on both
    seqs = [append_response(p.inputs, [int(t) for t in r.token_ids], tiny.spec)
            for p, group in zip(prompts, out["plain"]) for r in group]
    padded = collate(seqs, tiny.family, tiny.spec, tiny.pad_id)
    with torch.no_grad():
        a = sequence_logprobs(plain, padded).logprobs
        b = sequence_logprobs(packed, padded).logprobs
    torch.testing.assert_close(b, a, rtol=0, atol=0)
