"""Group-shared prompts (`models.shared_prefix`): each group's prompt runs once, and every
response token's log-prob, entropy and gradient equal those of its own prompt + response sequence.

Tiny models of every family, float32; a batch that mixes video, image, video+image and text
prompts (so the dummy vision block is exercised by micro-batches that lack a modality), groups of
unequal size with responses of unequal length (one empty, as in padding groups), and a
micro-batch split that cuts a group. Qwen3.5's linear-attention layers run each response from its
prompt's state (`models.linear_attention`; its own tests: test_linear_attention.py). The gradient
test runs Qwen3.5-MoE too, replaying an engine's routes (`engine_routes`) as the trainer does.
"""

from __future__ import annotations

import copy

import pytest
import torch
from model_media import make_image, make_sample, make_video

from easyvideor1.algorithms import AlgorithmConfig
from easyvideor1.models.collate import collate
from easyvideor1.models.families import MODEL_FAMILIES
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.packing import PaddedRows, use_packed_attention
from easyvideor1.models.routing import perturb_selection, recording, release, router_settings
from easyvideor1.models.shared_prefix import shared_prefix_blocker
from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout
from easyvideor1.training.sequences import (ForwardContext, collate_responses, forward_logprobs, make_batch,
                                           micro_batches, sequence_inputs)
from easyvideor1.training.update import policy_update
from step_gradients import one_step_gradients, record_step_gradients

# Same tokens, same weights, only the summation order of attention and matmuls differs.
LOGPROB_TOL = 1e-5
DENSE = [name for name, f in MODEL_FAMILIES.items() if not f.moe]  # conftest's `tiny` families
NOISE = 0.05  # the engine's selection noise (test_routing_replay.py): ~18% of (token, layer) routes differ


def _batch(tiny):
    fam = tiny.family
    video, image = make_video(fam), make_image(fam)
    video2 = make_video(fam, frames=2, rows=1, cols=2, seed=3)
    cases = {"video": [video], "image": [image], "text": [], "video+image": [video2, image]}
    prompts = [Prompt(make_sample(name, frames), frames,
                      build_inputs(make_sample(name, frames), frames, "What is shown?", tiny.processor, fam, tiny.spec))
               for name, frames in cases.items()]
    tok = tiny.processor.tokenizer
    texts = [["It is red.", "Two squares moving left, then right.", "4"],
             ["A", "The cat"],
             ["Forty-two is the answer to it all.", "", "no"],
             ["Left.", "Up and down and up."]]
    groups = [[Rollout(g, tok(t + "<|im_end|>")["input_ids"] if t else [], t) for t in ts] for g, ts in enumerate(texts)]
    return make_batch(prompts, groups)


def engine_routes(tiny, batch) -> None:
    """MoE: give each response the routes an engine that routes otherwise (`perturb_selection`)
    recorded over its prompt + response. Replayed (`replay`), they pick the experts, so a route at the
    wrong token or row moves log-probs and gradients, which the router's own choice would not."""
    engine = copy.deepcopy(tiny.model)
    perturb_selection(engine, NOISE, seed=3)
    ctx = ForwardContext(tiny.family, tiny.spec, tiny.pad_id, micro_batch_size=batch.size, temperature=1.0)
    mb = collate(sequence_inputs(batch, list(range(batch.size)), ctx), tiny.family, tiny.spec, tiny.pad_id)
    with torch.no_grad(), recording(engine) as recorder:
        engine(**mb.model_kwargs())
        routes = recorder.take(tuple(mb.input_ids.shape))  # [B, L, layers, k]
    for r, (row, start, end) in zip(batch.rollouts, mb.seq_spans):
        r.routes = routes[row, start:end]


def unreplayed_gap(tiny, batch, logp) -> float:
    """The largest gap between replayed log-probs `logp` [N, T] and those of the model routing on its
    own: > 1e-3 where the routes are in effect."""
    own = ForwardContext(tiny.family, tiny.spec, tiny.pad_id, micro_batch_size=batch.size, temperature=1.0)
    with torch.no_grad():
        unreplayed = forward_logprobs(tiny.model, batch, list(range(batch.size)), own)[0]
    return float((unreplayed - logp)[batch.response_mask].abs().max())


def replay(tiny) -> dict:
    """The context fields of the trainer's default for a MoE model (`algorithm.routing_replay=rollout`)."""
    if not tiny.family.moe:
        return {}
    return {"router_shape": router_settings("rollout", tiny.model)[0], "routing_replay": True}


def _ctx(tiny, shared: bool, micro: int) -> ForwardContext:
    return ForwardContext(tiny.family, tiny.spec, tiny.pad_id, micro_batch_size=micro, temperature=1.0,
                          chunk_size=7, shared_prefix=shared, **replay(tiny))


def _pass(tiny, batch, shared: bool, micro: int, grad: bool = False):
    model = tiny.model
    use_packed_attention(model)  # group rows run as pieces (models.packing); other rows still get SDPA
    model.zero_grad(set_to_none=True)
    parts = []
    for idx in micro_batches(list(range(batch.size)), micro):
        with torch.set_grad_enabled(grad):
            logp, ent, _ = forward_logprobs(model, batch, idx, _ctx(tiny, shared, micro), with_entropy=True)
        if grad:  # a loss that weighs every token differently, so a misplaced token shows
            w = torch.arange(1, logp.numel() + 1, dtype=torch.float32).reshape(logp.shape) / logp.numel()
            ((logp * w).sum() + 0.1 * ent.sum()).backward()
            if tiny.family.moe:
                release(model)  # the routes served the backward (as `training.update` does)
        parts.append((logp.detach(), ent.detach()))
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None} if grad else {}
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), grads


def test_padded_group_rows_carry_pieces_not_a_mask(tiny):
    """Right-padded group rows: no attention mask; each row's group block (prompt, responses) then
    its padding, and text ids 0..L-1 so that transformers builds no mask either."""
    batch = _batch(tiny)
    mb = collate_responses(batch, list(range(batch.size)), _ctx(tiny, True, batch.size))
    assert mb.attention_mask is None and isinstance(mb.packing, PaddedRows)
    width = mb.input_ids.shape[1]
    assert (mb.position_ids[0] == torch.arange(width)).all()
    assert len(mb.packing.rows) == mb.input_ids.shape[0] == len(mb.seq_spans) == 4
    for row, (_, start, end) in zip(mb.packing.rows, mb.seq_spans):
        assert row.length == width and row.blocks[0] == (start, end) and row.shared[0]
        assert row.parts[0][0] > 1 and sum(row.parts[0]) == end  # the prompt, then the responses


@pytest.mark.parametrize("micro", [4, 3])
def test_logprobs_equal_the_plain_path(tiny, micro):
    """micro=4 holds whole groups and mixes modalities; micro=3 cuts groups across micro-batches."""
    batch = _batch(tiny)
    plain, plain_ent, _ = _pass(tiny, batch, False, micro)
    shared, shared_ent, _ = _pass(tiny, batch, True, micro)
    mask = batch.response_mask
    assert mask.sum() > 20 and plain.abs().max() > 1
    diff = (plain - shared)[mask].abs().max()
    assert shared_prefix_blocker(tiny.model.config) is None
    assert diff <= LOGPROB_TOL, f"{tiny.family.name}: max |logp diff| {diff:.2e}"
    assert (plain_ent - shared_ent)[mask].abs().max() <= LOGPROB_TOL


def _shares(tiny) -> None:
    """Every family shares exactly (Qwen3.5's linear-attention layers too)."""
    assert shared_prefix_blocker(tiny.model.config) is None


@pytest.mark.parametrize("tiny", [*DENSE, "qwen3_5_moe"], indirect=True)
def test_gradients_equal_the_plain_path(tiny):
    """Qwen3.5-MoE (Gated DeltaNet, gated shared expert, routed experts) replays an engine's routes:
    a group row takes its prompt's routes once and each response's own after them."""
    _shares(tiny)
    batch = _batch(tiny)
    if tiny.family.moe:
        engine_routes(tiny, batch)
    logp, _, plain = _pass(tiny, batch, False, 3, grad=True)
    _, _, shared = _pass(tiny, batch, True, 3, grad=True)
    assert set(plain) == set(shared) and any("visual" in n for n in plain)
    if tiny.family.moe:  # the routes are in effect: routed on its own, the model scores otherwise
        assert any(".mlp.experts." in n for n in plain) and any(".mlp.gate." in n for n in plain)
        assert unreplayed_gap(tiny, batch, logp) > 1e-3
    for name, g in plain.items():
        torch.testing.assert_close(shared[name], g, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_blocker_names_the_attention_backend(tiny):
    text = tiny.model.config.get_text_config()
    saved = text._attn_implementation
    try:
        text._attn_implementation = "eager"
        assert "'eager'" in shared_prefix_blocker(tiny.model.config)
    finally:
        text._attn_implementation = saved


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("loss", ["ppo_clip", "gspo", "cispo", "luffy"])
def test_policy_update_gradients_equal_the_plain_path(tiny, loss, agg):
    """One `policy_update` (lr 0, so the model stays put) per path; the gradients it leaves equal.
    Old log-probs are perturbed so ratios leave 1 and the clips engage; one response is offline."""
    _shares(tiny)
    batch = _batch(tiny)
    logp, _, _ = _pass(tiny, batch, False, 3)
    g = torch.Generator().manual_seed(0)
    mask = batch.response_mask
    batch.old_log_probs = (logp + 0.3 * torch.randn(logp.shape, generator=g)) * mask
    batch.advantages = torch.randn(batch.size, 1, generator=g).expand_as(logp) * mask
    batch.offline[2] = True
    algo = AlgorithmConfig(policy_loss=loss, loss_agg_mode=agg, disable_kl=True)
    grads = {}
    for shared in (False, True):
        optimizer = torch.optim.SGD(tiny.model.parameters(), lr=0.0)
        seen = record_step_gradients(tiny.model, optimizer)
        metrics = policy_update(tiny.model, optimizer, batch, algo, _ctx(tiny, shared, 4), ppo_epochs=1, n_mini=1,
                                grad_clip=1e9, max_len=32, kl_coef=0.0)
        assert metrics["update/skipped_nonfinite"] == 0
        grads[shared] = one_step_gradients(seen)
    assert set(grads[False]) == set(grads[True])
    assert max(float(v.abs().max()) for v in grads[False].values()) > 1e-4
    for name, plain in grads[False].items():
        torch.testing.assert_close(grads[True][name], plain, rtol=1e-4, atol=1e-7, msg=lambda m: f"{name}: {m}")
    tiny.model.zero_grad(set_to_none=True)


def test_full_kl_to_a_reference_is_scored_at_the_same_positions(tiny):
    """The reference runs on the same shared rows and scores from the same positions: against
    itself the exact KL is 0 at every response token (a first token scored from the previous
    response's last position instead of the prompt's would show here)."""
    _shares(tiny)
    batch = _batch(tiny)
    with torch.no_grad():
        _, _, kl = forward_logprobs(tiny.model, batch, list(range(batch.size)), _ctx(tiny, True, batch.size),
                                    reference=tiny.model)
    assert kl[batch.response_mask].abs().max() <= 1e-6
