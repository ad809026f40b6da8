"""The MATH-kernel check (easyvideor1/models/kernel_check.py), tested on a CPU by structure.

The calls are recorded from a real training step of a tiny Qwen2.5-VL: two query heads over one
key/value head, so grouped-query attention as in every target model. The step covers the vision
windows, packed and group-shared rows with gradient checkpointing, and an HF generate call for
transformers' unpacked SDPA with masks. `fused_attention._cuda` is made true while recording,
so the calls have the layout CUDA gets (float32 repeats the key/value heads there). The rule
then says which of those calls would fall back on which GPU, and why. The warning and error
paths run with planted calls, as if on a given GPU (`kernel_check.watch(gpu=...)`).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from test_attention_calls import _batch
from torch.overrides import TorchFunctionMode

from easyvideor1.algorithms import AlgorithmConfig
from easyvideor1.config import Config
from easyvideor1.models import fused_attention as fused
from easyvideor1.models import kernel_check as kc
from easyvideor1.models.families import get_family
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.packing import use_packed_attention
from easyvideor1.training.sequences import ForwardContext, forward_logprobs
from easyvideor1.training.update import policy_update

A100, H100, T4 = kc.Gpu((8, 0)), kc.Gpu((9, 0)), kc.Gpu((7, 5))


class _Record(TorchFunctionMode):
    """The arguments of every top-level `F.scaled_dot_product_attention` call, as `kernel_check.Call`s."""

    def __init__(self):
        super().__init__()
        self.calls: list[kc.Call] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls.append(kc.Call.of(*args, **kwargs))
        return func(*args, **kwargs)


def _record(path, dtype: str, cuda_layout: bool, monkeypatch) -> list[kc.Call]:
    """The SDPA calls of one training step (policy_update over packed group-shared rows, recompute on)
    and of a short HF generate (transformers' SDPA with masks), in `dtype`."""
    if cuda_layout:
        monkeypatch.setattr(fused, "_cuda", lambda t: True)
    model = load_policy(path, dtype=dtype, gradient_checkpointing=True)
    use_packed_attention(model)
    family, processor, spec = get_family("qwen2_5_vl"), load_processor(path), mrope_spec(model.config)
    batch = _batch(family, processor, spec)
    ctx = ForwardContext(family, spec, processor.tokenizer.pad_token_id, micro_batch_size=4, temperature=1.0,
                         chunk_size=16, shared_prefix=True, padding_free=True)
    with torch.no_grad():
        logp, _, _ = forward_logprobs(model, batch, list(range(batch.size)), ctx)
    batch.old_log_probs = logp
    batch.advantages = torch.linspace(-1, 1, batch.size)[:, None].expand_as(logp) * batch.response_mask
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    tok = processor.tokenizer
    tok.padding_side = "left"
    prompts = tok(["What is shown in the video?", "Hi"], return_tensors="pt", padding=True)
    with _Record() as rec:
        policy_update(model, optimizer, batch, AlgorithmConfig(disable_kl=True), ctx, ppo_epochs=1, n_mini=1,
                      grad_clip=1e9, max_len=64, kl_coef=0.0)
        model.eval()
        with torch.no_grad():
            model.generate(**prompts, max_new_tokens=2, do_sample=False)
    return rec.calls


@pytest.fixture(scope="module")
def calls(tiny_dirs):
    """dtype -> the calls CUDA would get (bfloat16, float32), and "cpu float32": as the CPU passes them."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        out["cpu float32"] = _record(tiny_dirs["qwen2_5_vl"], "float32", False, mp)
    for dtype in ("bfloat16", "float32"):
        with pytest.MonkeyPatch.context() as mp:
            out[dtype] = _record(tiny_dirs["qwen2_5_vl"], dtype, True, mp)
    return out


def _kinds(calls):
    """The recorded call kinds: each must be present for the checks below to mean anything."""
    return {"window": [c for c in calls if c.mask == "none" and not c.is_causal and c.q[-3] == c.k[-3]
                       and c.q[-1] != 32],  # the vision tower (head dim 16 in the tiny model)
            "causal": [c for c in calls if c.is_causal],
            "after_prompt": [c for c in calls if c.mask == "lower_right"],
            "masked": [c for c in calls if c.mask == "tensor"]}  # transformers' SDPA at generate


def test_every_call_of_a_training_step_takes_a_fused_kernel_on_a100_and_h100(calls):
    for dtype in ("bfloat16", "float32"):
        kinds = _kinds(calls[dtype])
        assert all(kinds.values()), {k: len(v) for k, v in kinds.items()}
        assert any(c.requires_grad for c in kinds["after_prompt"])  # the backward's constraints were checked
        for gpu in (A100, H100):
            assert [(c.describe(), kc.math_reason(c, gpu)) for c in calls[dtype] if kc.math_reason(c, gpu)] == []
    # bfloat16: the language model's calls (grouped-query, no tensor mask) go to flash, GQA natively
    for c in _kinds(calls["bfloat16"])["causal"] + _kinds(calls["bfloat16"])["after_prompt"]:
        assert c.enable_gqa and c.k[-3] < c.q[-3] and kc.kernel(c, H100)[0] == "flash"
    # float32 (flash takes half precision only): the key/value heads are repeated, memory-efficient takes them
    for c in _kinds(calls["float32"])["causal"] + _kinds(calls["float32"])["after_prompt"]:
        assert not c.enable_gqa and c.k[-3] == c.q[-3] and kc.kernel(c, H100)[0] == "efficient"
    # generate's masked calls: transformers repeats the key/value heads with a mask; memory-efficient takes them
    assert {kc.kernel(c, H100)[0] for c in _kinds(calls["bfloat16"])["masked"]} == {"efficient"}


def test_the_rule_names_the_calls_that_would_fall_back_and_why(calls):
    # float32 calls as the CPU passes them (grouped-query natively) would fall back on CUDA: the reason
    # fused_attention._heads repeats the key/value heads there
    lm = [c for c in calls["cpu float32"] if c.enable_gqa]
    assert lm and all(kc.kernel(c, H100)[0] == "math" for c in lm)
    reason = kc.math_reason(next(c for c in lm if c.mask == "lower_right"), H100)
    assert "flash: dtype float32" in reason and "memory-efficient: 2 query / 1 key-value heads" in reason
    assert "built its [Lq, Lk] mask" in reason and "cuDNN: comes after MATH" in reason
    # the vision windows (equal heads, no mask) are fine in float32 everywhere: memory-efficient
    assert {kc.kernel(c, T4)[0] for c in _kinds(calls["cpu float32"])["window"]} == {"efficient"}
    # a T4 (sm75): no flash, no bfloat16 for memory-efficient, so every bfloat16 call falls back
    for c in calls["bfloat16"]:
        why = kc.math_reason(c, T4)
        assert why and ("flash: runs on sm80-sm121 only, this GPU is sm75" in why
                        or "flash: takes no tensor mask" in why)
        assert "memory-efficient: dtype bfloat16 on sm75" in why or "takes no grouped-query heads" in why
    # float16 on the T4: memory-efficient takes the equal-head calls, not the grouped-query ones
    half = [replace(c, dtype=torch.float16) for c in calls["bfloat16"]]
    assert {kc.kernel(c, T4)[0] for c in half if c.q[-3] == c.k[-3]} == {"efficient"}
    assert all("takes no grouped-query heads" in kc.math_reason(c, T4) for c in half if c.enable_gqa)


def test_planted_calls_each_reason():
    base = kc.Call((1, 4, 64, 128), (1, 2, 256, 128), (1, 2, 256, 128), torch.bfloat16, "lower_right", (64, 256),
                   enable_gqa=True, requires_grad=True)
    assert kc.kernel(base, H100)[0] == "flash"
    cases = {  # planted change -> what the reason must name
        "head dim": (replace(base, q=(1, 4, 64, 320), k=(1, 2, 256, 320), v=(1, 2, 256, 320)), H100,
                     "head dims 320/320/320 (must be equal and <= 256)"),
        "mask with GQA": (replace(base, mask="tensor", mask_shape=(64, 256)), H100,
                          "flash: takes no tensor mask; memory-efficient: 4 query / 2 key-value heads"),
        "dtype": (replace(base, dtype=torch.float32), A100, "flash: dtype float32"),
        "sm86 backward": (replace(base, q=(1, 4, 64, 200), k=(1, 2, 256, 200), v=(1, 2, 256, 200)),
                          kc.Gpu((8, 6)), "no backward with head dim 200 on sm86"),
        "flash off": (base, replace(H100, disabled=frozenset({"flash"})), "flash: turned off"),
        "non-square is_causal": (replace(base, mask="none", mask_shape=(), is_causal=True), H100,
                                 "is_causal with unequal query and key lengths"),
        "stride": (replace(base, unit_stride=False), H100, "a stride other than 1"),
    }
    for name, (call, gpu, expected) in cases.items():
        why = kc.math_reason(call, gpu)
        assert why is not None and expected in why, (name, why)
    # with MATH off (strict), cuDNN after MATH is still tried, and takes the bias's mask with GQA
    masked = replace(base, dtype=torch.bfloat16)
    no_flash = replace(H100, disabled=frozenset({"flash"}))
    assert kc.kernel(masked, no_flash)[0] == "math"
    assert kc.kernel(masked, replace(no_flash, disabled=frozenset({"flash", "math"})))[0] == "cudnn"
    assert kc.kernel(masked, replace(no_flash, order=("cudnn", "flash", "efficient", "math")))[0] == "cudnn"
    assert kc.kernel(masked, replace(no_flash, deterministic=True, disabled=frozenset({"flash", "math"})))[0] == "none"
    # a square lower-right bias is plain is_causal; equal heads in float32 go to memory-efficient
    square = replace(base, k=(1, 2, 64, 128), v=(1, 2, 64, 128), mask_shape=(64, 64))
    assert kc.kernel(square, H100)[0] == "flash"
    assert kc.kernel(replace(base, dtype=torch.float32, k=(1, 4, 256, 128), v=(1, 4, 256, 128), enable_gqa=False),
                     H100)[0] == "efficient"


def _planted(n=3, s=8, dtype=torch.bfloat16):
    """`fused.after_prompt`'s arguments: 4 query heads over 2 key/value heads, a response of n over s keys."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, n, 16, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, s, 16, generator=g).to(dtype) for _ in range(2))
    return q, k, v


@pytest.fixture
def fresh(monkeypatch):
    """No strictness from the environment (the test suite sets EASYVIDEOR1_FUSED_ATTENTION=1), no earlier warnings."""
    monkeypatch.delenv(kc.STRICT_ENV, raising=False)
    monkeypatch.setattr(kc, "_warned", set())
    monkeypatch.setattr(kc, "_verdicts", {})
    monkeypatch.setattr(kc, "_strict", False)


def test_a_call_that_would_fall_back_warns_once_per_reason(fresh, caplog):
    caplog.set_level(logging.WARNING, logger=kc.__name__)
    with kc.watch(gpu=T4):
        out = fused.after_prompt(*_planted(), scale=0.25)  # runs (on the CPU) after the warning
        fused.after_prompt(*_planted(5, 9), scale=0.25)  # the same reason, other shapes: not logged again
        fused.causal(*_planted(6, 6), scale=0.25)  # another reason (no bias): logged once
    assert out.shape == (1, 4, 3, 16)
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2, logged
    assert "would run SDPA's MATH kernel" in logged[0]
    assert "for q [1, 4, 3, 16] bfloat16, k/v [1, 2, 8, 16]" in logged[0]
    assert "lower-right causal bias" in logged[0] and "sm80-sm121 only, this GPU is sm75" in logged[0]
    assert "q [1, 4, 6, 16] bfloat16" in logged[1] and "is_causal" in logged[1]
    with kc.watch(gpu=H100):  # a GPU whose flash takes them: nothing
        fused.after_prompt(*_planted(), scale=0.25)
    assert len(caplog.records) == 2


@pytest.mark.parametrize("how", ["config", "environment"])
def test_strict_raises_before_the_call(fresh, monkeypatch, how):
    if how == "config":
        monkeypatch.setattr(kc, "_strict", False)
        kc.set_strict(Config().model.strict_kernels)
        assert not kc.strict()
        kc.set_strict(True)
    else:
        monkeypatch.setenv(kc.STRICT_ENV, "1")
    with kc.watch(gpu=T4), pytest.raises(RuntimeError, match=r"MATH kernel.*q \[1, 4, 3, 16\] bfloat16.*sm75"):
        fused.after_prompt(*_planted(), scale=0.25)
    with kc.watch(gpu=H100):
        fused.after_prompt(*_planted(), scale=0.25)  # flash takes it: no error


def test_torch_own_checks_decide_on_a_gpu(fresh, caplog):
    """On a GPU, torch's `can_use_*` decide (the rule gives the reason): stand-ins show both disagreements."""
    caplog.set_level(logging.WARNING, logger=kc.__name__)
    fp32_gqa = _planted(dtype=torch.float32)  # the rule: MATH on an H100 (memory-efficient takes no GQA here)
    newer = {"flash": lambda p: False, "efficient": lambda p: True, "cudnn": lambda p: False}  # a torch whose does
    with kc.watch(gpu=H100, can_use=newer):
        F.scaled_dot_product_attention(*fp32_gqa, is_causal=True, enable_gqa=True)
    assert caplog.records == []
    seen = []
    refuses_all = {name: (lambda p, name=name: seen.append(name) or False) for name in ("flash", "efficient", "cudnn")}
    with kc.watch(gpu=H100, can_use=refuses_all):  # the rule's flash would take it, torch's does not
        F.scaled_dot_product_attention(*_planted(6, 6), is_causal=True, enable_gqa=True)
    assert seen == ["flash", "efficient"]  # in the priority order, up to MATH
    assert len(caplog.records) == 1 and "flash: refused by torch's own check" in caplog.records[0].getMessage()
    with kc.watch(gpu=H100, can_use=refuses_all):  # an equal call (a decode step's next layer): asked once
        F.scaled_dot_product_attention(*_planted(6, 6), is_causal=True, enable_gqa=True)
    assert seen == ["flash", "efficient"] and len(caplog.records) == 1


def test_kernel_policy_watches_cuda_calls_only():
    def watching():
        return any(isinstance(m, kc._Watch) for m in torch.overrides._get_current_function_mode_stack())

    with fused.kernel_policy(torch.device("cuda")):
        assert watching()
    with fused.kernel_policy(torch.device("cpu")):
        assert not watching()
    assert Config().model.strict_kernels is False
