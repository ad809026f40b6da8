"""Chunked per-token log-probs and entropy, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from easyvideor1.models.logprobs import token_logprobs, token_logprobs_and_kl


def _head(weight: list[list[float]]) -> torch.nn.Linear:
    head = torch.nn.Linear(len(weight[0]), len(weight), bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor(weight))
    return head


# hidden (1, 0) -> logits (0, 0, ln 2) -> softmax (1/4, 1/4, 1/2)
# hidden (0, 1) -> logits (ln 3, 0, 0) -> softmax (3/5, 1/5, 1/5)
HEAD = [[0.0, math.log(3)], [0.0, 0.0], [math.log(2), 0.0]]
HIDDEN = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
TARGETS = [2, 0, 1]
EXPECTED_LOGP = [math.log(1 / 2), math.log(3 / 5), math.log(1 / 4)]
# H = -sum p ln p
H1 = -(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5))  # 1.5 ln 2
H2 = -(0.6 * math.log(0.6) + 2 * 0.2 * math.log(0.2))
EXPECTED_ENTROPY = [H1, H2, H1]


@pytest.mark.parametrize("chunk_size", [1, 2, 1024])
def test_hand_computed_logprobs_and_entropy(chunk_size):
    logp, ent = token_logprobs(
        torch.tensor(HIDDEN), _head(HEAD), torch.tensor(TARGETS), chunk_size=chunk_size, with_entropy=True
    )
    torch.testing.assert_close(logp, torch.tensor(EXPECTED_LOGP), rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, torch.tensor(EXPECTED_ENTROPY), rtol=0, atol=1e-6)
    assert abs(H1 - 1.5 * math.log(2)) < 1e-12


def test_temperature_divides_the_logits():
    # temperature 2 on logits (0, 0, ln 2) -> (0, 0, ln 2 / 2) -> p3 = sqrt2 / (2 + sqrt2)
    logp, ent = token_logprobs(torch.tensor([[1.0, 0.0]]), _head(HEAD), torch.tensor([2]), temperature=2.0)
    expected = math.log(math.sqrt(2) / (2 + math.sqrt(2)))
    assert ent is None
    assert abs(logp.item() - expected) < 1e-6


def test_chunked_gradients_equal_unchunked():
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(37, 8, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (37,), generator=g)
    grads = []
    for chunk in (5, 1000):
        head.zero_grad()
        hidden.grad = None
        logp, ent = token_logprobs(hidden, head, targets, chunk_size=chunk, with_entropy=True)
        (logp.sum() + 0.1 * ent.sum()).backward()
        grads.append((hidden.grad.clone(), head.weight.grad.clone(), logp.detach()))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # chunk sums reorder float adds


def test_empty_and_bad_chunk():
    logp, ent = token_logprobs(torch.zeros(0, 2), _head(HEAD), torch.zeros(0, dtype=torch.long), with_entropy=True)
    assert logp.shape == (0,) and ent.shape == (0,)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(torch.zeros(1, 2), _head(HEAD), torch.zeros(1, dtype=torch.long), chunk_size=0)


@pytest.mark.parametrize("chunk", [5, 1000])
def test_full_kl_per_token_equals_the_vocabulary_sum_with_its_gradient(chunk):
    """The exact KL(pi || pi_ref) of each row, chunked, equals the sum over the whole
    vocabulary of full [N, V] distributions, and so does its gradient (the reference gets none)."""
    g = torch.Generator().manual_seed(1)
    head, ref_head = torch.nn.Linear(8, 50, bias=False), torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(37, 8, generator=g, requires_grad=True)
    ref_hidden = hidden.detach() + 0.3 * torch.randn(37, 8, generator=g)
    targets = torch.randint(0, 50, (37,), generator=g)

    p = torch.log_softmax(head(hidden) / 0.7, -1)  # [37, 50], the whole thing at once
    q = torch.log_softmax(ref_head(ref_hidden) / 0.7, -1)
    explicit = (p.exp() * (p - q)).sum(-1)
    (want_h, want_w) = torch.autograd.grad(explicit.sum(), (hidden, head.weight))

    logp, ent, kl = token_logprobs_and_kl(hidden, head, targets, ref_hidden, ref_head, chunk_size=chunk,
                                          temperature=0.7)
    assert ent is None
    torch.testing.assert_close(kl, explicit, rtol=1e-5, atol=1e-6)
    assert kl.min() > 0
    torch.testing.assert_close(logp, p.gather(-1, targets[:, None])[:, 0], rtol=0, atol=1e-6)
    got_h, got_w = torch.autograd.grad(kl.sum(), (hidden, head.weight))
    torch.testing.assert_close(got_h, want_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)
    assert ref_head.weight.grad is None
    with pytest.raises(ValueError, match="rows"):
        token_logprobs_and_kl(hidden, head, targets, ref_hidden[:3], ref_head)
