"""Policy losses: hand-computed values and gradients, clipping exactly outside the band, gradcheck,
and robustness (empty masks, single tokens, huge log-ratios, garbage on padding)."""

import math

import pytest
import torch

from easyvideor1.algorithms import POLICY_LOSSES, AlgorithmConfig, LossInputs, kl_estimate


def call_loss(name, *, cfg, normalizer, kl_coef=None, **inputs):
    """A policy loss with keyword inputs, called as `training.update` calls it (a `LossInputs`)."""
    return POLICY_LOSSES[name](LossInputs(**inputs), cfg, normalizer, kl_coef=kl_coef)


D = torch.float64
CFG = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, disable_kl=True)


def run(name, ratios, adv, mask=None, cfg=CFG, normalizer=None, **kw):
    """Call loss `name` with log_probs = old + log(ratios); return (loss, metrics, d loss / d log_probs)."""
    ratios = torch.as_tensor(ratios, dtype=D)
    old = torch.full_like(ratios, -1.0)
    lp = (old + ratios.log()).requires_grad_(True)
    mask = torch.ones_like(ratios) if mask is None else torch.as_tensor(mask)
    normalizer = float(mask.sum()) if normalizer is None else normalizer
    loss, metrics = call_loss(name, log_probs=lp, old_log_probs=old, advantages=torch.as_tensor(adv, dtype=D),
                                        response_mask=mask, cfg=cfg, normalizer=normalizer, **kw)
    loss.backward()
    return loss.item(), metrics, lp.grad


def test_ppo_clip_hand_values():
    # band [0.8, 1.28], dual clip 3
    ratios = [[1.1, 1.5, 0.7, 0.7, 1.5, 4.0]]
    adv = [[1.0, 1.0, 1.0, -1.0, -1.0, -1.0]]
    loss, m, grad = run("ppo_clip", ratios, adv)
    # per token: -1.1 ; -1.28 (clipped high) ; -0.7 (A > 0 below band: not clipped) ;
    #            +0.8 (A < 0 below band: clipped) ; +1.5 (A < 0 above band: not clipped) ; +3 (dual clip)
    assert loss == pytest.approx((-1.1 - 1.28 - 0.7 + 0.8 + 1.5 + 3.0) / 6)
    # d(-A r)/d log pi = -A r where unclipped, 0 where clipped
    assert grad[0].tolist() == pytest.approx([-1.1 / 6, 0, -0.7 / 6, 0, 1.5 / 6, 0])
    assert (m["clip_frac_high"], m["clip_frac_low"], m["dual_clip_frac"]) == pytest.approx((1 / 6, 1 / 6, 1 / 6))
    assert m["ratio_max"] == pytest.approx(4.0) and m["ratio_min"] == pytest.approx(0.7)
    assert m["approx_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r in ratios[0]) / 6)


def test_ppo_without_dual_clip():
    cfg = AlgorithmConfig(clip_ratio_c=None, disable_kl=True)
    loss, m, _ = run("ppo_clip", [[4.0]], [[-1.0]], cfg=cfg)
    assert loss == pytest.approx(4.0) and "dual_clip_frac" not in m


def test_clipping_active_exactly_outside_the_band():
    g = torch.Generator().manual_seed(0)
    ratios = torch.exp(torch.randn(1, 400, generator=g, dtype=D) * 0.6)
    adv = torch.randn(1, 400, generator=g, dtype=D)
    _, _, grad = run("ppo_clip", ratios, adv)
    clipped = ((adv > 0) & (ratios > 1.28)) | ((adv < 0) & (ratios < 0.8)) | ((adv < 0) & (ratios > 3.0))
    assert clipped.any() and (~clipped).any()
    assert torch.all(grad[clipped] == 0)
    assert torch.all(grad[~clipped] != 0)
    assert torch.allclose(grad[~clipped], (-adv * ratios / 400)[~clipped])


def test_gspo_sequence_ratio_hand_values():
    cfg = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="seq_mean_token_mean",
                          disable_kl=True)
    # seq 0: token log-ratios [0.1, 0.3] -> s = exp(0.2) = 1.2214 (in band); seq 1: [0.5] -> s = 1.6487 (clipped)
    ratios = [[math.exp(0.1), math.exp(0.3)], [math.exp(0.5), 1.0]]
    mask = [[1, 1], [1, 0]]
    loss, m, grad = run("gspo", ratios, [1.0, 1.0], mask=mask, cfg=cfg, normalizer=2.0)
    assert loss == pytest.approx((-math.exp(0.2) - 1.28) / 2)
    # d(-s)/d lp_t = -s / |y| per token of seq 0, over 2 sequences; seq 1 is clipped
    assert grad[0].tolist() == pytest.approx([-math.exp(0.2) / 2 / 2] * 2)
    assert grad[1].tolist() == [0.0, 0.0]
    assert m["clip_frac_high"] == 0.5 and m["clip_frac_low"] == 0.0


def test_gspo_token_equals_gspo_for_sequence_advantages_and_uses_token_advantages():
    cfg = AlgorithmConfig(loss_agg_mode="seq_mean_token_mean", clip_ratio_low=0.2, clip_ratio_high=0.28,
                          disable_kl=True)
    g = torch.Generator().manual_seed(1)
    ratios = torch.exp(torch.randn(3, 4, generator=g, dtype=D) * 0.2)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=D)
    a = run("gspo", ratios, adv, mask=mask, cfg=cfg, normalizer=3.0)
    b = run("gspo_token", ratios, adv[:, None].expand(3, 4), mask=mask, cfg=cfg, normalizer=3.0)
    assert a[0] == pytest.approx(b[0]) and torch.allclose(a[2], b[2])
    # token advantages [1, -1], both log-ratios 0 (s = 1): losses [-1, +1], gradient -A_t * s / 2 tokens
    loss, _, grad = run("gspo_token", [[1.0, 1.0]], [[1.0, -1.0]], cfg=cfg, normalizer=1.0)
    assert loss == pytest.approx(0.0) and grad[0].tolist() == pytest.approx([-0.5, 0.5])


def test_cispo_keeps_gradient_on_clipped_tokens():
    cfg = AlgorithmConfig(policy_loss="cispo", clip_ratio_low=0.2, clip_ratio_high=0.28, disable_kl=True)
    loss, m, grad = run("cispo", [[1.5, 0.5, 1.0]], [[1.0, 1.0, -2.0]], cfg=cfg)
    # log pi = -1 + log r; weights sg(clip(r)) = [1.28, 0.8, 1.0]; loss = -sum(w * A * log pi) / 3
    lp = [-1 + math.log(1.5), -1 + math.log(0.5), -1.0]
    assert loss == pytest.approx(-(1.28 * lp[0] + 0.8 * lp[1] - 2.0 * lp[2]) / 3)
    assert grad[0].tolist() == pytest.approx([-1.28 / 3, -0.8 / 3, 2.0 / 3])
    assert m["clip_frac"] == pytest.approx(2 / 3)


def test_luffy_shapes_offline_tokens_and_clips_online_ones():
    cfg = AlgorithmConfig(policy_loss="luffy", luffy_gamma=0.1, clip_ratio_high=0.28, disable_kl=True)
    old = torch.tensor([[-1.0, -1.0, -1.0]], dtype=D)
    lp = torch.tensor([[math.log(0.5), math.log(0.5), -1.0 + math.log(1.5)]], dtype=D, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=D)
    offline = torch.tensor([[1, 1, 0]])
    behaviour = torch.tensor([[0.0, math.log(0.25), 0.0]], dtype=D)  # token 0: unknown -> pi_b = 1
    loss, m = call_loss("luffy", log_probs=lp, old_log_probs=old, advantages=adv, response_mask=torch.ones(1, 3),
                                     cfg=cfg, normalizer=3.0, offline_mask=offline, behaviour_log_probs=behaviour)
    loss.backward()
    # token 0: x = 0.5 -> f = 0.5 / 0.6 ; token 1: x = 0.5 / 0.25 = 2 -> f = 2 / 2.1 ; token 2: PPO, clipped at 1.28
    assert loss.item() == pytest.approx(-(0.5 / 0.6 + 2 / 2.1 + 1.28) / 3)
    # d f / d log pi = x * gamma / (x + gamma)^2 ; clipped token: 0
    assert lp.grad[0].tolist() == pytest.approx([-0.5 * 0.1 / 0.6**2 / 3, -2 * 0.1 / 2.1**2 / 3, 0.0])
    assert m["offline_token_frac"] == pytest.approx(2 / 3) and m["clip_frac_high"] == 1.0
    # a huge off-policy ratio is not clipped: the gradient is small but non-zero
    _, _, grad = run("luffy", [[math.exp(6.0)]], [[1.0]], cfg=cfg, offline_mask=torch.tensor([1]),
                     behaviour_log_probs=torch.tensor([[-6.0]], dtype=D))
    assert grad[0, 0] < 0


def test_kl_loss_and_entropy_bonus_enter_the_loss():
    cfg = AlgorithmConfig(use_kl_loss=True, kl_estimator="low_var_kl", kl_coef=0.5, entropy_coef=0.1)
    lp = torch.tensor([[math.log(0.5), math.log(0.5)]], dtype=D, requires_grad=True)
    ent = torch.tensor([[1.0, 3.0]], dtype=D, requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=D)
    loss, m = call_loss("ppo_clip", log_probs=lp, old_log_probs=lp.detach(), advantages=torch.zeros(1, dtype=D),
                                        response_mask=torch.ones(1, 2), cfg=cfg, normalizer=2.0, entropy=ent,
                                        ref_log_probs=ref)
    k3 = 0.5 + math.log(2) - 1  # token 0: d = log(0.25 / 0.5); token 1: d = 0 -> 0
    assert m["kl_loss"] == pytest.approx(k3 / 2) and m["entropy"] == pytest.approx(2.0)
    assert loss.item() == pytest.approx(0.5 * k3 / 2 - 0.1 * 2.0)
    loss.backward()
    assert ent.grad[0].tolist() == pytest.approx([-0.1 / 2, -0.1 / 2])
    # a controller's coefficient overrides cfg.kl_coef
    loss2, _ = call_loss("ppo_clip", log_probs=lp, old_log_probs=lp.detach(), advantages=torch.zeros(1, dtype=D),
                                         response_mask=torch.ones(1, 2), cfg=cfg, normalizer=2.0, entropy=ent,
                                         ref_log_probs=ref, kl_coef=1.0)
    assert loss2.item() == pytest.approx(k3 / 2 - 0.1 * 2.0)


def test_kl_full_in_the_loss_uses_full_kl():
    cfg = AlgorithmConfig(use_kl_loss=True, kl_estimator="full", kl_coef=1.0)
    logits = torch.tensor([[[0.0, 0.0]]], dtype=D, requires_grad=True)  # pi = [0.5, 0.5]
    dists = torch.log_softmax(logits, -1)
    ref = torch.tensor([[[0.25, 0.75]]], dtype=D).log()
    full_kl = kl_estimate(dists, ref, "full")  # [1, 1], what models.logprobs hands on per chunk
    loss, m = call_loss("ppo_clip", log_probs=dists[..., 0], old_log_probs=dists[..., 0].detach(),
                                        advantages=torch.zeros(1, dtype=D), response_mask=torch.ones(1, 1), cfg=cfg,
                                        normalizer=1.0, full_kl=full_kl)
    assert m["kl_loss"] == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3))
    loss.backward()
    # d KL / d logit_0 = p0 * (log(p0/q0) - KL) = 0.5 * (ln 2 - KL)
    kl = m["kl_loss"]
    assert logits.grad[0, 0].tolist() == pytest.approx([0.5 * (math.log(2) - kl), 0.5 * (math.log(2 / 3) - kl)])
    with pytest.raises(ValueError, match=r"full_kl=\[N, T\]"):
        call_loss("ppo_clip", log_probs=dists[..., 0].detach(), old_log_probs=dists[..., 0].detach(),
                                  advantages=torch.zeros(1, dtype=D), response_mask=torch.ones(1, 1), cfg=cfg,
                                  normalizer=1.0, ref_log_probs=ref[..., 0])


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_missing_inputs_and_typos_are_errors(name):
    base = dict(log_probs=torch.zeros(1, 2), old_log_probs=torch.zeros(1, 2), advantages=torch.ones(1),
                response_mask=torch.ones(1, 2), normalizer=2.0)
    with pytest.raises(ValueError, match="ref_log_probs"):
        call_loss(name, **base, cfg=AlgorithmConfig(use_kl_loss=True))
    with pytest.raises(ValueError, match="entropy"):
        call_loss(name, **base, cfg=AlgorithmConfig(disable_kl=True, entropy_coef=0.01))
    with pytest.raises(TypeError, match="ref_logprobs"):
        call_loss(name, **base, cfg=CFG, ref_logprobs=torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"advantages must be \[N\] or \[N, T\]"):
        call_loss(name, **{**base, "advantages": torch.ones(3)}, cfg=CFG)


# gspo_token and cispo hold stop-gradients of log pi itself, which finite differences cannot see;
# their gradients are checked against hand values above.
@pytest.mark.parametrize("name", [n for n in POLICY_LOSSES if n not in ("gspo_token", "cispo")])
def test_gradcheck(name):
    g = torch.Generator().manual_seed(2)
    # ratios in (0.9, 1.1): inside every band, away from the kinks of clipping
    old = -torch.rand(2, 3, generator=g, dtype=D) - 0.5
    lp = (old + (torch.rand(2, 3, generator=g, dtype=D) - 0.5) * 0.2).requires_grad_(True)
    adv = torch.randn(2, 3, generator=g, dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    ref = old - 0.1
    cfg = AlgorithmConfig(use_kl_loss=True, kl_coef=0.3, clip_ratio_high=0.28)

    def f(x):
        return call_loss(name, log_probs=x, old_log_probs=old, advantages=adv, response_mask=mask, cfg=cfg,
                                   normalizer=5.0, ref_log_probs=ref, offline_mask=torch.tensor([1, 0]))[0]
    assert torch.autograd.gradcheck(f, (lp,))


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_no_nan_for_empty_masks_single_tokens_and_huge_ratios(name, mode):
    cfg = AlgorithmConfig(loss_agg_mode=mode, use_kl_loss=True, entropy_coef=0.01)
    lp = torch.tensor([[-1e4, 3.0, float("-inf")], [1e4, float("nan"), float("inf")], [0.0, 0.0, 0.0]],
                      requires_grad=True)
    old = torch.tensor([[0.0, -50.0, 0.0], [-1e4, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # padding holds -inf / nan / inf; one empty row
    kw = dict(log_probs=lp, old_log_probs=old, advantages=torch.tensor([1.0, -1.0, 1.0]), response_mask=mask,
              cfg=cfg, normalizer=3.0, ref_log_probs=torch.zeros(3, 3), entropy=torch.ones(3, 3),
              offline_mask=torch.tensor([1, 0, 0]))
    loss, metrics = call_loss(name, **kw)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())
    empty, metrics = call_loss(name, **{**kw, "log_probs": torch.zeros(3, 3, requires_grad=True),
                                            "response_mask": torch.zeros(3, 3)})
    assert empty.item() == 0.0 and all(math.isfinite(v) for v in metrics.values())


def test_bf16_inputs_are_computed_in_float32():
    lp = torch.tensor([[-1.0 + math.log(1.1)]], dtype=torch.bfloat16, requires_grad=True)
    loss, m = call_loss("ppo_clip", log_probs=lp, old_log_probs=torch.full((1, 1), -1.0, dtype=torch.bfloat16),
                                        advantages=torch.ones(1), response_mask=torch.ones(1, 1), cfg=CFG,
                                        normalizer=1.0)
    loss.backward()
    assert loss.dtype == torch.float32 and lp.grad.dtype == torch.bfloat16
