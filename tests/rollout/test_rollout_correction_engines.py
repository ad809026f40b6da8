"""Rollout correction against an injected mismatch: responses sampled by a noised copy of the
policy (HF engine), trained on by the policy. `token_tis` engages (tokens clipped) and the
update's gradient equals the hand-weighted one, -A * min(pi_old / pi_rollout, C) * d log pi."""

import copy

import torch
from rollout_helpers import load_tiny

from easyvideor1.algorithms.config import AlgorithmConfig
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.rollout.base import SamplingParams, banned_token_ids
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.training.sequences import ForwardContext, forward_logprobs, make_batch
from easyvideor1.training.update import policy_update
from step_gradients import one_step_gradients, record_step_gradients

C = 1.5


def test_injected_mismatch_engages_and_gradient_is_hand_weighted(tmp_path):
    tiny = load_tiny("qwen2_5_vl", build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0))
    noised = copy.deepcopy(tiny.model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in noised.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    prompts = tiny.prompts()
    groups = HFEngine(noised, tiny.processor, tiny.family, tiny.spec).generate(
        prompts, 2, SamplingParams(temperature=1.0, max_tokens=6, seed=3))
    batch = make_batch(prompts, groups)
    mask = batch.response_mask
    adv = torch.linspace(-1.0, 1.0, batch.size)
    batch.advantages = torch.where(mask, adv[:, None], 0.0)
    ctx = ForwardContext(family=tiny.family, spec=tiny.spec, pad_token_id=tiny.tokenizer.pad_token_id,
                         micro_batch_size=3, temperature=1.0, banned_ids=tuple(banned_token_ids(tiny.tokenizer)))
    model = tiny.model
    model.requires_grad_(True)
    algo = AlgorithmConfig(disable_kl=True, rollout_correction_threshold=C)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # weights unchanged
    seen = record_step_gradients(model, optimizer)  # the update frees .grad after its step
    metrics = policy_update(model, optimizer, batch, algo, ctx, ppo_epochs=1, n_mini=1, grad_clip=1e9,
                            max_len=6, kl_coef=0.0, correction="token_tis")
    got = one_step_gradients(seen)
    assert set(got) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert metrics["mismatch/corrected_frac"] > 0 and metrics["mismatch/ratio_max"] > C

    model.zero_grad(set_to_none=True)
    logp = forward_logprobs(model, batch, list(range(batch.size)), ctx)[0]  # [N, T]
    weights = torch.exp(logp.detach() - batch.behaviour_log_probs).clamp(max=C)  # by hand: min(r, C)
    assert ((weights - 1).abs() > 0.05)[mask].any()
    hand = -(batch.advantages * weights * logp)[mask].sum() / mask.sum()  # token_mean, on-policy ratio 1
    hand.backward()
    for n, p in model.named_parameters():
        assert torch.allclose(got[n], p.grad, atol=1e-6, rtol=1e-4), n
    ratio = torch.exp(logp.detach() - batch.behaviour_log_probs)[mask]
    assert abs(metrics["mismatch/kl"] - float((ratio - 1 - ratio.log()).mean())) < 1e-5  # k3
