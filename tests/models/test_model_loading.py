"""Loading the policy (frozen vision, gradient checkpointing, dtype) and the reference."""

from __future__ import annotations

import pytest
import torch
from model_media import make_sample, make_video

from easyvideor1.models.collate import collate
from easyvideor1.models.families import get_family
from easyvideor1.models.inputs import append_response, build_inputs
from easyvideor1.models.loading import (
    load_policy,
    load_processor,
    load_reference,
    vision_tower,
)
from easyvideor1.models.logprobs import sequence_logprobs
from easyvideor1.models.mrope import mrope_spec


def _batch(path, model):
    family, processor, spec = get_family("qwen2_5_vl"), load_processor(path), mrope_spec(model.config)
    video = make_video(family)
    prompt = build_inputs(make_sample("v", [video]), [video], "hi", processor, family, spec)
    seq = append_response(prompt, processor.tokenizer("red<|im_end|>")["input_ids"], spec)
    return collate([seq], family, spec, processor.tokenizer.pad_token_id)


def test_freeze_vision_and_gradient_checkpointing(tiny_dirs):
    path = tiny_dirs["qwen2_5_vl"]
    plain = load_policy(path, dtype="float32")
    frozen = load_policy(path, dtype="float32", freeze_vision=True, gradient_checkpointing=True)
    assert frozen.training and frozen.is_gradient_checkpointing
    assert not any(p.requires_grad for p in vision_tower(frozen).parameters())
    visual = {id(p) for p in vision_tower(frozen).parameters()}
    assert all(p.requires_grad for p in frozen.parameters() if id(p) not in visual)

    batch = _batch(path, plain)
    losses = []
    for model in (plain, frozen):
        loss = -sequence_logprobs(model, batch).logprobs.sum()
        loss.backward()
        losses.append(loss.detach())
    # Same batch, same shapes (bitwise equal where measured); the tolerance, relative to this
    # sum of log-probs (~14), only absorbs kernel-level reordering of the checkpointed re-run.
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=0)
    assert all(p.grad is None for p in vision_tower(frozen).parameters())
    head = dict(frozen.named_parameters())["lm_head.weight"].grad
    torch.testing.assert_close(head, plain.lm_head.weight.grad, rtol=1e-5, atol=1e-7)


def test_reference_is_frozen_and_dtype_applies(tiny_dirs):
    ref = load_reference(tiny_dirs["qwen3_vl"], dtype="bfloat16")
    assert not ref.training
    assert not any(p.requires_grad for p in ref.parameters())
    assert ref.lm_head.weight.dtype == torch.bfloat16


def test_errors_say_what_to_do(tmp_path, tiny_dirs):
    with pytest.raises(FileNotFoundError, match="easyvideor1 tiny-model"):
        load_policy(tmp_path / "nothing")
    with pytest.raises(ValueError, match="float32, bfloat16, float16"):
        load_policy(tiny_dirs["qwen2_vl"], dtype="fp8")
