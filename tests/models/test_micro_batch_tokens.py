"""Token-budget micro-batches (`training.micro_batch_tokens`) against the fixed-count path.

Same mini-batch, same model: the log-prob pass returns every response's log-probs in response
order and `policy_update` leaves the same gradients, whatever the split. Tiny models of every
family, float32; prompts of very unequal lengths (a many-frame video with a long question, an
image, a short text, a video + image), responses of 0 to ~40 tokens; padded and packed rows
(families that pack), one row per response and group-shared rows.
"""

from __future__ import annotations

import pytest
import torch
from model_media import make_image, make_sample, make_video

from easyvideor1.algorithms import AlgorithmConfig
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.packing import packing_blocker, use_packed_attention
from easyvideor1.models.shared_prefix import shared_prefix_blocker
from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout
from easyvideor1.training.sequences import ForwardContext, all_logprobs, make_batch, pass_micro_batches
from easyvideor1.training.update import policy_update
from step_gradients import one_step_gradients, record_step_gradients

LOGPROB_TOL = 1e-5  # same tokens and weights; only summation order (row width, batch shape) differs
BUDGET = 160  # tokens: the long prompt's rows go over it alone, the short ones pack several together


def _batch(tiny):
    fam = tiny.family
    long_video = make_video(fam, frames=8, rows=2, cols=4, seed=1)
    cases = {"long-video": ([long_video], "Describe every object and its motion, frame by frame. " * 4),
             "image": ([make_image(fam)], "What colour?"),
             "text": ([], "2+2?"),
             "video+image": ([make_video(fam, frames=2, rows=1, cols=2, seed=3), make_image(fam)], "Which?")}
    prompts = []
    for name, (frames, question) in cases.items():
        sample = make_sample(name, frames)
        prompts.append(Prompt(sample, frames, build_inputs(sample, frames, question, tiny.processor, fam, tiny.spec)))
    tok = tiny.processor.tokenizer
    texts = [["It is red and moves left, then right, then stops near the top edge of the frame.", "A"],
             ["Blue.", "", "Green, mostly, with a red square in the corner."],
             ["4", "Four, since two and two make four."],
             ["Left.", "The one on the right, it is brighter."]]
    groups = [[Rollout(g, tok(t + "<|im_end|>")["input_ids"] if t else [], t) for t in ts] for g, ts in enumerate(texts)]
    return make_batch(prompts, groups)


def _ctx(tiny, shared: bool, packed: bool, tokens: int) -> ForwardContext:
    return ForwardContext(tiny.family, tiny.spec, tiny.pad_id, micro_batch_size=2, temperature=1.0, chunk_size=7,
                          shared_prefix=shared, padding_free=packed, micro_batch_tokens=tokens)


def _modes(tiny):
    out = []
    for shared in (False, True):
        for packed in (False, True):
            if shared and shared_prefix_blocker(tiny.model.config) is not None:
                continue
            if packed and (not tiny.family.padding_free or packing_blocker(tiny.model.config) is not None):
                continue
            out.append((shared, packed))
    return out


@pytest.fixture
def packed_model(tiny):
    """The tiny model with its language model on packed attention (SDPA when unpacked), restored after."""
    text = tiny.model.config.get_text_config()
    saved = text._attn_implementation
    if tiny.family.padding_free and packing_blocker(tiny.model.config) is None:
        use_packed_attention(tiny.model)
    yield tiny
    tiny.model.set_attn_implementation({"text_config": saved})


def test_plan_is_not_the_fixed_split(tiny):
    """The budget plan really differs from 2 responses per micro-batch (else the tests below prove nothing)."""
    batch = _batch(tiny)
    for shared in (False, True):
        fixed = pass_micro_batches(batch, list(range(batch.size)), _ctx(tiny, shared, False, 0))
        budget = pass_micro_batches(batch, list(range(batch.size)), _ctx(tiny, shared, False, BUDGET))
        assert [m.indices for m in fixed] != [m.indices for m in budget]
        assert sorted(i for m in budget for i in m.indices) == list(range(batch.size))
        long_rows = [u.tokens for m in budget for u in m.units if 0 in u.indices]
        assert long_rows[0] > BUDGET  # the long prompt's row is over the budget: alone
        assert all(m.cost <= BUDGET for m in budget if len(m.units) > 1)


def test_logprobs_come_back_in_response_order(packed_model):
    tiny = packed_model
    batch = _batch(tiny)
    mask = batch.response_mask
    with torch.no_grad():
        for shared, packed in _modes(tiny):
            fixed = all_logprobs(tiny.model, batch, _ctx(tiny, shared, packed, 0))
            budget = all_logprobs(tiny.model, batch, _ctx(tiny, shared, packed, BUDGET))
            assert mask.sum() > 40 and fixed[mask].abs().max() > 1
            diff = (fixed - budget)[mask].abs().max()
            assert diff <= LOGPROB_TOL, f"{tiny.family.name} shared={shared} packed={packed}: {diff:.2e}"
            assert (budget[~mask] == 0).all()


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_policy_update_gradients_equal_the_fixed_count_path(packed_model, agg):
    """One `policy_update` (lr 0) per split; the gradients it leaves are equal (the normaliser
    counts the same tokens / sequences in any partition). Old log-probs perturbed so the clip engages."""
    tiny = packed_model
    batch = _batch(tiny)
    g = torch.Generator().manual_seed(0)
    mask = batch.response_mask
    with torch.no_grad():
        logp = all_logprobs(tiny.model, batch, _ctx(tiny, False, False, 0))
    batch.old_log_probs = (logp + 0.3 * torch.randn(logp.shape, generator=g)) * mask
    batch.advantages = torch.randn(batch.size, 1, generator=g).expand_as(logp) * mask
    algo = AlgorithmConfig(policy_loss="ppo_clip", loss_agg_mode=agg, disable_kl=True)
    for shared, packed in _modes(tiny):
        grads, metrics = {}, {}
        for tokens in (0, BUDGET):
            optimizer = torch.optim.SGD(tiny.model.parameters(), lr=0.0)
            seen = record_step_gradients(tiny.model, optimizer)
            metrics[tokens] = policy_update(tiny.model, optimizer, batch, algo, _ctx(tiny, shared, packed, tokens),
                                            ppo_epochs=1, n_mini=1, grad_clip=1e9, max_len=48, kl_coef=0.0)
            grads[tokens] = one_step_gradients(seen)
        where = f"{tiny.family.name} shared={shared} packed={packed}"
        assert set(grads[0]) == set(grads[BUDGET]) and any("visual" in n for n in grads[0]), where
        assert max(float(v.abs().max()) for v in grads[0].values()) > 1e-4
        for name, fixed in grads[0].items():
            torch.testing.assert_close(grads[BUDGET][name], fixed, rtol=1e-4, atol=1e-7,
                                       msg=lambda m: f"{where} {name}: {m}")
        assert metrics[BUDGET]["actor/pg_loss"] == pytest.approx(metrics[0]["actor/pg_loss"], rel=1e-4, abs=1e-7)
        if packed:
            assert metrics[BUDGET]["perf/padding_fraction"] == 0.0
        else:
            assert metrics[BUDGET]["perf/padding_fraction"] > 0.0
    tiny.model.zero_grad(set_to_none=True)
