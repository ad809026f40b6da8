"""Every attention call of a real training step is one a fused CUDA kernel takes (issue 26).

A tiny Qwen2.5-VL (2 query heads, 1 key/value head: grouped-query attention, as every target
model), gradient checkpointing on (so the backward's recomputation is recorded too), one
`policy_update` over group-shared rows, packed and right-padded. The recorder
(attention_recorder.py) sees each `scaled_dot_product_attention` call: none may pass a tensor mask
with unequal query/key-value heads (CUDA's flash and memory-efficient kernels refuse it, so it
would run on MATH, materialising [H, L, L] float32 scores), and no mask tensor may have L x L
elements. CPU kernels would run either, so only the arguments can show it.
"""

from __future__ import annotations

import pytest
import torch
from attention_recorder import AttentionRecorder
from model_media import make_image, make_sample, make_video

from easyvideor1.algorithms import AlgorithmConfig
from easyvideor1.models.families import get_family
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.packing import use_packed_attention
from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout
from easyvideor1.training.sequences import ForwardContext, forward_logprobs, make_batch
from easyvideor1.training.update import policy_update


def _batch(family, processor, spec):
    video, image = make_video(family), make_image(family)
    cases = {"video": [video], "image": [image], "text": []}
    prompts = [Prompt(make_sample(name, frames), frames,
                      build_inputs(make_sample(name, frames), frames, "What is shown?", processor, family, spec))
               for name, frames in cases.items()]
    tok = processor.tokenizer
    texts = [["It is red.", "Two squares moving left, then right.", "Blue"], ["A", "The cat"],
             ["Forty-two is the answer.", "no", "Up and down."]]
    groups = [[Rollout(g, tok(t + "<|im_end|>")["input_ids"], t) for t in ts] for g, ts in enumerate(texts)]
    return make_batch(prompts, groups)


@pytest.mark.parametrize("padding_free", [True, False], ids=["packed", "padded"])
def test_training_step_calls_only_fused_kernels(tiny_dirs, padding_free):
    path = tiny_dirs["qwen2_5_vl"]
    model = load_policy(path, dtype="float32", gradient_checkpointing=True)
    text = model.config.get_text_config()
    assert text.num_attention_heads != text.num_key_value_heads  # GQA, as Qwen2.5-VL-7B (28 / 4)
    use_packed_attention(model)  # what the trainer does for padding-free or group-shared rows
    family, processor, spec = get_family("qwen2_5_vl"), load_processor(path), mrope_spec(model.config)
    batch = _batch(family, processor, spec)
    ctx = ForwardContext(family, spec, processor.tokenizer.pad_token_id, micro_batch_size=4, temperature=1.0,
                         chunk_size=16, shared_prefix=True, padding_free=padding_free)
    with torch.no_grad():
        logp, _, _ = forward_logprobs(model, batch, list(range(batch.size)), ctx)
    batch.old_log_probs = logp
    batch.advantages = torch.linspace(-1, 1, batch.size)[:, None].expand_as(logp) * batch.response_mask
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with AttentionRecorder() as rec:
        policy_update(model, optimizer, batch, AlgorithmConfig(disable_kl=True), ctx, ppo_epochs=1, n_mini=1,
                      grad_clip=1e9, max_len=64, kl_coef=0.0)
    shortest_row = min(p.inputs.prompt_len for p in batch.prompts)
    assert rec.problems(shortest_row) == []
    lm = [c for c in rec.calls if c.q_heads == text.num_attention_heads and c.mask != "none"]
    assert any(c.mask == "lower_right" and c.kv_len > c.q_len for c in lm)  # responses over their prompt
    assert any(c.mask == "causal" for c in lm)  # prompts
