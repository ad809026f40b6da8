"""parity_report: hand-computed gaps, and the trainer's log-prob pass against HF engine rollouts."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import load_tiny

from easyvideor1.models.collate import collate
from easyvideor1.models.inputs import append_response
from easyvideor1.records import Rollout
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.training.parity import parity_report, trainer_logprob_fn


def test_report_by_hand(hf_tiny_dirs):
    tiny = load_tiny("qwen2_5_vl", hf_tiny_dirs["qwen2_5_vl"])
    prompts = tiny.prompts()[:3]  # video, image, text
    tok = tiny.tokenizer
    hello = tok.encode("hello world", add_special_tokens=False)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    rollouts = [
        [Rollout(0, hello + [eot], "hello world", [-1.0] * (len(hello) + 1))],
        [Rollout(1, [5, 6], "not the text of 5 6", [-0.5, -0.25]), Rollout(1, [100], "", None, offline=True)],
        [Rollout(2, [8, 9, 10], "x", [-2.0, -2.0, -2.0])],
    ]
    recomputed = {
        0: [-1.0] * len(hello) + [-1.3],  # one gap of 0.3
        1: [-0.6, -0.05],  # gaps 0.1 and 0.2
        2: [-2.0, -2.0, -2.0],  # no gap
    }

    def logprob_fn(ps, rs):
        assert len(rs) == 3  # the offline rollout (no engine log-probs) is skipped
        return [torch.tensor(recomputed[r.prompt_index]) for r in rs]

    report = parity_report(prompts, rollouts, logprob_fn, tokenizer=tok)
    n0 = len(hello) + 1
    assert report["video"] == pytest.approx(
        {"max_abs_gap": 0.3, "mean_abs_gap": 0.3 / n0, "tokens": n0, "responses": 1}
    )
    assert report["image"] == pytest.approx(
        {"max_abs_gap": 0.2, "mean_abs_gap": 0.15, "tokens": 2, "responses": 1}
    )
    assert report["text"] == pytest.approx(
        {"max_abs_gap": 0.0, "mean_abs_gap": 0.0, "tokens": 3, "responses": 1}
    )
    total = n0 + 5
    assert report["all"] == pytest.approx(
        {"max_abs_gap": 0.3, "mean_abs_gap": 0.6 / total, "tokens": total, "responses": 3}
    )
    # "hello world" re-encodes to its ids; "not the text of 5 6", "" (offline) and "x" do not
    assert report["retokenize_agreement"] == pytest.approx(1 / 4)

    short = lambda ps, rs: [torch.tensor(recomputed[r.prompt_index][:1]) for r in rs]  # noqa: E731
    with pytest.raises(ValueError, match=f"'vid': {n0} response tokens but {n0} engine and 1 recomputed"):
        parity_report(prompts, rollouts, short)


def test_trainer_logprobs_against_hf_engine(hf_tiny):
    """Engine log-probs vs the trainer's pass (`sequence_logprobs` with our position ids) on
    every modality: without the pads banned in the pass, the only gap is the vision pad ban,
    log(1 - p(pads)) < 0.05 for random tiny models; with them banned (the loop's pass) none.""" 
    params = SamplingParams(temperature=0.8, max_tokens=6, seed=1)
    engine = HFEngine(hf_tiny.model, hf_tiny.processor, hf_tiny.family, hf_tiny.spec)
    prompts = hf_tiny.prompts()
    rollouts = engine.generate(prompts, 2, params)
    fn = trainer_logprob_fn(
        hf_tiny.model,
        hf_tiny.family,
        hf_tiny.spec,
        hf_tiny.tokenizer.pad_token_id,
        params.logprob_temperature,
    )
    report = parity_report(prompts, rollouts, fn)
    assert set(report) == {"video", "image", "text", "image+video", "all"}
    assert report["all"]["responses"] == 8
    assert report["all"]["tokens"] == sum(len(r.token_ids) for g in rollouts for r in g)
    assert 0 < report["all"]["mean_abs_gap"] <= report["all"]["max_abs_gap"] < 0.05

    # Per token, the gap is exactly -log(1 - p(pads)) under the trainer's distribution.
    prompt, r = prompts[3], rollouts[3][0]
    item = append_response(prompt.inputs, r.token_ids, hf_tiny.spec)
    batch = collate([item], hf_tiny.family, hf_tiny.spec, hf_tiny.tokenizer.pad_token_id)
    with torch.no_grad():
        logits = hf_tiny.model(**batch.model_kwargs()).logits[0, item.prompt_len - 1 : -1]
    p_pads = (logits / params.temperature).softmax(-1)[:, engine.banned].sum(-1)
    gap = torch.tensor(r.logprobs) - fn([prompt], [r])[0]
    assert torch.allclose(gap, -torch.log1p(-p_pads), atol=1e-5)

    # The loop's pass bans the pads as the engine does: no gap left.
    banned = trainer_logprob_fn(hf_tiny.model, hf_tiny.family, hf_tiny.spec, hf_tiny.tokenizer.pad_token_id,
                                params.logprob_temperature, banned_ids=tuple(engine.banned))
    assert parity_report(prompts, rollouts, banned)["all"]["max_abs_gap"] < 1e-5
