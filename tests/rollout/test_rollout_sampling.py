"""Sampling math of the HF engine against hand-computed values, and the sampling params."""

from __future__ import annotations

import math

import pytest
import torch

from easyvideor1.rollout.base import SamplingParams, sample_seeds
from easyvideor1.rollout.sampling import draw, next_tokens, sampling_logprobs, top_k_top_p

LOGITS = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
NEG = float("-inf")


def close(actual: torch.Tensor, expected: list[float]) -> None:
    exp = torch.tensor([expected])
    finite = torch.isfinite(exp)
    assert torch.equal(torch.isfinite(actual), finite), (actual, exp)
    assert torch.allclose(actual[finite], exp[finite], atol=1e-6), (actual, exp)


def test_greedy_logprobs_ban_then_softmax():
    # ban id 0 -> log_softmax([1, 0, -1]); lse = log(e + 1 + 1/e) = log(4.086161) = 1.407606
    lp = sampling_logprobs(LOGITS, SamplingParams(temperature=0), torch.tensor([0]))
    close(lp, [NEG, -0.407606, -1.407606, -2.407606])


def test_temperature_divides_logits():
    # [-, .5, 0, -.5]: lse = log(1.648721 + 1 + 0.606531) = log(3.255252) = 1.180268
    lp = sampling_logprobs(LOGITS, SamplingParams(temperature=2.0), torch.tensor([0]))
    close(lp, [NEG, -0.680268, -1.180268, -1.680268])


def test_top_k_keeps_k_and_ties():
    # keep {2, 1}: lse = log(e^2 + e) = log(10.107338) = 2.313262
    close(sampling_logprobs(LOGITS, SamplingParams(top_k=2), None), [-0.313262, -1.313262, NEG, NEG])
    # a tie with the k-th value is kept (vLLM): top-1 of [1, 1, 0] keeps both ones
    kept = top_k_top_p(torch.tensor([[1.0, 1.0, 0.0]]), top_k=1, top_p=1.0)
    close(kept.log_softmax(-1), [-math.log(2), -math.log(2), NEG])


def test_top_p_drops_the_low_tail():
    # probs [0.643914, 0.236883, 0.087144, 0.032059]; ascending cumsum 0.032, 0.119, 0.356, 1
    # top_p 0.9 drops cum <= 0.1 (only -1): lse = log(e^2 + e + 1) = log(11.107338) = 2.407606
    close(sampling_logprobs(LOGITS, SamplingParams(top_p=0.9), None), [-0.407606, -1.407606, -2.407606, NEG])
    # top_p 0.8 drops cum <= 0.2 (0 and -1)
    close(sampling_logprobs(LOGITS, SamplingParams(top_p=0.8), None), [-0.313262, -1.313262, NEG, NEG])
    # top_p tiny: the most likely token always stays
    close(sampling_logprobs(LOGITS, SamplingParams(top_p=1e-6), None), [0.0, NEG, NEG, NEG])


def test_draw_greedy_and_seeded():
    lp = sampling_logprobs(LOGITS.repeat(3, 1), SamplingParams(temperature=0), torch.tensor([0]))
    assert draw(lp, True, [None] * 3).tolist() == [1, 1, 1]
    lp = sampling_logprobs(LOGITS.repeat(3, 1), SamplingParams(), None)
    a = draw(lp, False, [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    b = draw(lp, False, [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    assert torch.equal(a, b)


def test_draw_frequencies_follow_the_distribution():
    n = 4000
    lp = sampling_logprobs(LOGITS.repeat(n, 1), SamplingParams(), None)
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(draw(lp, False, [gen] * n), minlength=4).float() / n
    expected = torch.tensor([0.643914, 0.236883, 0.087144, 0.032059])
    assert (counts - expected).abs().max() < 0.03, counts


def test_banned_token_is_never_drawn_even_when_most_likely():
    logits = torch.tensor([[50.0, 0.0, 0.0]]).repeat(500, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, lps = next_tokens(logits, SamplingParams(), torch.tensor([0]), [gen] * 500)
    assert set(tokens.tolist()) == {1, 2}
    assert torch.allclose(lps, torch.full((500,), -math.log(2)))
    tokens, lps = next_tokens(logits[:1], SamplingParams(temperature=0), torch.tensor([0]), [None])
    assert tokens.tolist() == [1] and lps.tolist() == pytest.approx([-math.log(2)])


def test_sampling_params_validation_and_convention():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="list of strings"):
        SamplingParams(stop="</answer>")
    assert SamplingParams(temperature=0).logprob_temperature == 1.0
    assert SamplingParams(temperature=0.7).logprob_temperature == 0.7
    assert SamplingParams(stop=["a"]).stop == ("a",)


def test_sample_seeds_follow_vllm_fan_out():
    assert sample_seeds([2, 1, 3], 10) == [[10, 11], [12], [13, 14, 15]]
    assert sample_seeds([2], None) == [[None, None]]
