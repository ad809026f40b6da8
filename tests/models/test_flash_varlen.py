"""flash-attn's varlen path of packed rows (`fused_attention.varlen`), run on a CPU through the model.

With flash-attn installed, every packed-row attention call of the language model on CUDA in half
precision goes to one `flash_attn_varlen_func` per row (`packing._row`). That covers padding-free
rows, group-shared rows, right-padded group rows, Ulysses and the HF engine's prefill. The
recipe's config keeps `attn_implementation: sdpa`; the path is ours, not transformers' flash
integration, and flash-attn does not install here. So flash-attn is replaced by a reference
implementation of its contract (flash_varlen_reference.py). It is real attention: it asserts
int32 cu_seqlens, [total, heads, dim], fewer key/value heads, and bottom-right causal. The tiny
Qwen2.5-VL then runs a real log-prob forward and backward on video, image and text prompts. It
must equal the SDPA pieces' log-probs and gradients to 1e-5 in float32, and the cu_seqlens it
passes must be the rows' own pieces: each prompt, and each response over its prompt and itself.
"""

from __future__ import annotations

import itertools

import flash_varlen_reference as reference
import pytest
import torch
import transformers.modeling_flash_attention_utils as hf_flash
from test_attention_calls import _batch
from test_packed_attention import _row

from easyvideor1.models import fused_attention as fused
from easyvideor1.models.families import get_family
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.packing import Packing, PaddedRows, packed_attention, use_packed_attention
from easyvideor1.training.sequences import ForwardContext, collate_responses, forward_logprobs


def _cu(lengths) -> tuple[int, ...]:
    return (0, *itertools.accumulate(lengths))


def _expected(packing: Packing) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The cu_seqlens of one row: its pieces' queries, and their keys (a response's: its prompt, then itself)."""
    pieces = packing.pieces
    return (_cu(n for n, _ in pieces),
            _cu(n + (0 if prompt is None else pieces[prompt][0]) for n, prompt in pieces))


def _logprobs_and_grads(model, batch, ctx):
    model.zero_grad(set_to_none=True)
    logp, _, _ = forward_logprobs(model, batch, list(range(batch.size)), ctx)
    (logp * batch.response_mask).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("shared_prefix,padding_free", [(True, True), (False, True), (True, False)],
                         ids=["packed group rows", "packed sequences", "padded group rows"])
def test_flash_varlen_path_equals_sdpa_through_the_model(tiny_dirs, monkeypatch, shared_prefix, padding_free):
    path = tiny_dirs["qwen2_5_vl"]
    model = load_policy(path, dtype="float32")
    text = model.config.get_text_config()
    assert text.num_key_value_heads < text.num_attention_heads  # grouped-query, as the target models
    use_packed_attention(model)
    family, processor, spec = get_family("qwen2_5_vl"), load_processor(path), mrope_spec(model.config)
    batch = _batch(family, processor, spec)
    ctx = ForwardContext(family, spec, processor.tokenizer.pad_token_id, micro_batch_size=batch.size, temperature=1.0,
                         chunk_size=16, shared_prefix=shared_prefix, padding_free=padding_free)
    sdpa_logp, sdpa_grads = _logprobs_and_grads(model, batch, ctx)

    monkeypatch.setattr(fused, "_flash_varlen", lambda: reference.flash_attn_varlen_func)
    monkeypatch.setattr(fused, "varlen_available", lambda query: True)  # as on CUDA in half precision
    reference.calls.clear()
    flash_logp, flash_grads = _logprobs_and_grads(model, batch, ctx)

    torch.testing.assert_close(flash_logp, sdpa_logp, rtol=0, atol=1e-5)
    assert flash_grads.keys() == sdpa_grads.keys() and flash_grads
    for name, grad in flash_grads.items():
        torch.testing.assert_close(grad, sdpa_grads[name], rtol=1e-4, atol=1e-5, msg=name)

    packing = collate_responses(batch, list(range(batch.size)), ctx).packing
    rows = packing.rows if isinstance(packing, PaddedRows) else (packing,)
    expected = [_expected(row) for row in rows]
    head_dim = text.hidden_size // text.num_attention_heads
    # one call per row and text layer (the backward recomputes nothing here: no checkpointing)
    assert len(reference.calls) == len(rows) * text.num_hidden_layers
    for call, (cu_q, cu_k) in zip(reference.calls, expected * text.num_hidden_layers):
        assert (call.cu_seqlens_q, call.cu_seqlens_k) == (cu_q, cu_k)
        assert call.max_seqlen_q == max(b - a for a, b in zip(cu_q, cu_q[1:]))
        assert call.max_seqlen_k == max(b - a for a, b in zip(cu_k, cu_k[1:]))
        assert call.causal and call.q_shape == (cu_q[-1], text.num_attention_heads, head_dim)
        assert call.k_shape == (cu_k[-1], text.num_key_value_heads, head_dim)
    if shared_prefix:  # responses see their prompt: more keys than queries, bottom-right causal
        assert all(call.cu_seqlens_k[-1] > call.cu_seqlens_q[-1] for call in reference.calls)
    else:
        assert all(call.cu_seqlens_k == call.cu_seqlens_q for call in reference.calls)


def test_flash_attention_2_vision_tower_through_transformers_equals_sdpa(tiny_dirs, monkeypatch):
    """`model.attn_implementation: flash_attention_2` with flash-attn installed: the language model still runs
    packed rows (`use_packed_attention`, the varlen path above); the vision tower runs transformers' own flash
    integration (`integrations/flash_attention.py` -> `_flash_attention_forward` -> `flash_attn_varlen_func`
    with the tower's cu_seqlens). Here transformers' flash-attn import returns the reference, and the
    vision config is set as loading with flash_attention_2 sets it (flash-attn is not installed to load so)."""
    path = tiny_dirs["qwen2_5_vl"]
    model = load_policy(path, dtype="float32")
    use_packed_attention(model)
    family, processor, spec = get_family("qwen2_5_vl"), load_processor(path), mrope_spec(model.config)
    batch = _batch(family, processor, spec)
    ctx = ForwardContext(family, spec, processor.tokenizer.pad_token_id, micro_batch_size=batch.size, temperature=1.0,
                         chunk_size=16, shared_prefix=True, padding_free=True)
    sdpa_logp, sdpa_grads = _logprobs_and_grads(model, batch, ctx)

    monkeypatch.setattr(hf_flash, "_lazy_imports", lambda implementation, *args, **kwargs: (
        None, reference.flash_attn_varlen_func, None, hf_flash._pad_input, hf_flash._unpad_input))
    monkeypatch.setattr(hf_flash, "_loaded_implementation", None)
    monkeypatch.setattr(model.config.vision_config, "_attn_implementation_internal", "flash_attention_2")
    monkeypatch.setattr(fused, "_flash_varlen", lambda: reference.flash_attn_varlen_func)
    monkeypatch.setattr(fused, "varlen_available", lambda query: True)
    reference.calls.clear()
    flash_logp, flash_grads = _logprobs_and_grads(model, batch, ctx)

    torch.testing.assert_close(flash_logp, sdpa_logp, rtol=0, atol=1e-5)
    for name, grad in flash_grads.items():
        torch.testing.assert_close(grad, sdpa_grads[name], rtol=1e-4, atol=1e-5, msg=name)
    vision = [c for c in reference.calls if not c.causal]  # the tower's (bidirectional windows), int32 cu_seqlens
    text = model.config.get_text_config()
    assert vision and len(vision) == 2 * model.config.vision_config.depth  # the images' tower call, the videos'
    assert len(reference.calls) - len(vision) == text.num_hidden_layers  # one packed row: one call per layer


def test_flash_varlen_keeps_each_query_head_on_its_key_value_head(monkeypatch):
    """The tiny model has one key/value head; a row of 6 query heads over 3 checks the grouping (and gradients)."""
    q, k, v, packing = _row((12, 5, 14, 5), (0, 2), heads=6, kv_heads=3)
    ref, _ = packed_attention(None, q, k, v, None, packing=packing)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    monkeypatch.setattr(fused, "_flash_varlen", lambda: reference.flash_attn_varlen_func)
    monkeypatch.setattr(fused, "varlen_available", lambda query: True)
    reference.calls.clear()
    out, _ = packed_attention(None, q, k, v, None, packing=packing)
    assert len(reference.calls) == 1 and reference.calls[0].k_shape[1] == 3
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    for got, want in zip(torch.autograd.grad(out.square().sum(), (q, k, v)), ref_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_reference_holds_to_flash_attn_contract():
    """The reference itself: bottom-right causal, GQA in repeat_interleave order, int32 cu_seqlens."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(5, 4, 8, generator=g), torch.randn(9, 2, 8, generator=g), torch.randn(9, 2, 8, generator=g)
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32)
    out = reference.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 5, softmax_scale=0.5, causal=True)
    # sequence 1: 3 queries over 5 keys; query i sees keys 0 .. i + 2; head h reads key/value head h // 2
    for i, h in itertools.product(range(3), range(4)):
        keys = k[4:4 + i + 3, h // 2]
        weights = torch.softmax(keys @ q[2 + i, h] * 0.5, 0)
        torch.testing.assert_close(out[2 + i, h], weights @ v[4:4 + i + 3, h // 2])
    with pytest.raises(AssertionError, match="int32"):
        reference.flash_attn_varlen_func(q, k, v, cu_q.long(), cu_k, 3, 5, causal=True)
    with pytest.raises(AssertionError, match="max_seqlen_k"):
        reference.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 4, causal=True)
    # more queries than keys: the first rows see no key and are zero (flash-attn's convention)
    out = reference.flash_attn_varlen_func(q[:3], k[:1], v[:1], torch.tensor([0, 3], dtype=torch.int32),
                                           torch.tensor([0, 1], dtype=torch.int32), 3, 1, causal=True)
    assert out[:2].abs().max() == 0 and out[2].abs().max() > 0
