"""Tiny models of all four families: forward, backward and generate on video, image, text and
mixed batches; the masked dummy vision block; padding-free batches."""

from __future__ import annotations

import pytest
import torch
from model_media import make_image, make_sample, make_video

from easyvideor1.models.collate import collate
from easyvideor1.models.inputs import append_response, build_inputs
from easyvideor1.models.loading import load_policy, vision_tower
from easyvideor1.models.logprobs import sequence_logprobs
from easyvideor1.models.packing import use_packed_attention


def _prompts(tiny):
    fam = tiny.family
    video, image = make_video(fam), make_image(fam)
    video2 = make_video(fam, frames=2, rows=1, cols=2, seed=3)
    cases = {
        "video": [video],
        "image": [image],
        "text": [],
        "video+image": [video2, image],
    }
    return {
        name: build_inputs(make_sample(name, frames), frames, "What is shown?", tiny.processor, fam, tiny.spec)
        for name, frames in cases.items()
    }


def _with_responses(tiny, prompts, texts=("It is red.", "Two squares moving left.", "4", "A")):
    tok = tiny.processor.tokenizer
    return [
        append_response(p, tok(t + "<|im_end|>")["input_ids"], tiny.spec) for p, t in zip(prompts, texts)
    ]


def _loss(model, batch):
    lp = sequence_logprobs(model, batch)
    return -lp.logprobs.sum() / lp.mask.sum()


def _grads(model):
    return {n: p.grad for n, p in model.named_parameters()}


def test_mixed_batch_forward_backward_every_parameter(tiny):
    model = tiny.model
    seqs = _with_responses(tiny, list(_prompts(tiny).values()))
    batch = collate(seqs, tiny.family, tiny.spec, tiny.pad_id)
    assert batch.sample_ids == ["video", "image", "text", "video+image"]
    assert not batch.has_dummy_vision
    half = batch.to("cpu", torch.bfloat16)
    assert half.pixel_values.dtype == torch.bfloat16 and half.input_ids.dtype == torch.long
    model.zero_grad(set_to_none=True)
    loss = _loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    missing = [n for n, g in _grads(model).items() if g is None]
    assert missing == []
    # Our chunked log-probs equal the model's own full logits (fed our position ids). The head
    # runs on [tokens, H] here and on [B, L, H] there: other matmul blocking, a few float32 ulps
    # (~5e-7 at |log p| ~ 7) on some CPUs. Targets off by one token move them by > 0.3 (measured).
    with torch.no_grad():
        logits = model(**batch.model_kwargs()).logits[:, :-1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
        ours = sequence_logprobs(model, batch).logprobs[:, 1:]
    mask = batch.loss_mask[:, 1:]
    torch.testing.assert_close(ours[mask], ref[mask], rtol=0, atol=1e-5)


def test_full_kl_to_a_reference_equals_full_logits(tiny):
    """`kl_estimator: full`: the per-token KL that `sequence_logprobs` returns beside the
    log-probs equals the vocabulary sum over both models' own full logits; 0 against itself."""
    reference = load_policy(tiny.path, dtype="float32").requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    batch = collate(_with_responses(tiny, list(_prompts(tiny).values())), tiny.family, tiny.spec, tiny.pad_id)
    with torch.no_grad():
        out = sequence_logprobs(tiny.model, batch, temperature=0.9, reference=reference)
        same = sequence_logprobs(tiny.model, batch, temperature=0.9, reference=tiny.model)
        lp = torch.log_softmax(tiny.model(**batch.model_kwargs()).logits[:, :-1].float() / 0.9, -1)
        lq = torch.log_softmax(reference(**batch.model_kwargs()).logits[:, :-1].float() / 0.9, -1)
    explicit = (lp.exp() * (lp - lq)).sum(-1)  # [B, L-1]: the distribution that predicts token t+1
    mask = batch.loss_mask[:, 1:]
    torch.testing.assert_close(out.full_kl[:, 1:][mask], explicit[mask], rtol=1e-4, atol=1e-6)
    assert out.full_kl[:, 1:][mask].min() > 0 and torch.all(out.full_kl[~batch.loss_mask] == 0)
    assert same.full_kl.abs().max() < 1e-6
    torch.testing.assert_close(out.logprobs, same.logprobs, rtol=0, atol=0)


def test_each_modality_alone(tiny):
    """A micro-batch of only video, only image or only text runs forward and backward, and
    calls the vision tower exactly as often as a mixed batch (twice: FSDP ranks stay in step)."""
    prompts = _prompts(tiny)
    calls = []
    hook = vision_tower(tiny.model).register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        for name in ("video", "image", "text", "mixed"):
            items = [prompts["video"], prompts["image"]] if name == "mixed" else [prompts[name]] * 2
            seqs = _with_responses(tiny, items)
            batch = collate(seqs, tiny.family, tiny.spec, tiny.pad_id)
            tiny.model.zero_grad(set_to_none=True)
            calls.clear()
            _loss(tiny.model, batch).backward()
            assert len(calls) == 2, (name, len(calls))
            assert batch.has_dummy_vision == (name != "mixed")
            assert all(p.grad is not None for p in vision_tower(tiny.model).parameters()), name
    finally:
        hook.remove()


@pytest.mark.parametrize("n_seqs", [1, 2])
def test_dummy_vision_block_changes_nothing_but_reaches_every_vision_parameter(tiny, n_seqs):
    prompts = _prompts(tiny)
    seqs = _with_responses(tiny, [prompts["text"]] * n_seqs, texts=["4", "Four, I think."][:n_seqs])
    model = tiny.model
    plain = collate(seqs, tiny.family, tiny.spec, tiny.pad_id, dummy_vision=False)
    dummy = collate(seqs, tiny.family, tiny.spec, tiny.pad_id, dummy_vision=True)
    # Two dummies (an image and a video). One sequence: two new columns; two of unequal length:
    # the shorter one's padding slots.
    assert dummy.input_ids.shape[1] == plain.input_ids.shape[1] + (2 if n_seqs == 1 else 0)

    model.zero_grad(set_to_none=True)
    plain_loss = _loss(model, plain)
    plain_loss.backward()
    plain_grads = {n: g.clone() for n, g in _grads(model).items() if g is not None}
    assert all(p.grad is None for p in vision_tower(model).parameters())

    model.zero_grad(set_to_none=True)
    dummy_loss = _loss(model, dummy)
    dummy_loss.backward()
    # Not bitwise: one sequence gets two extra (masked) columns, which changes the kernels'
    # blocking, so the last bits differ on some CPUs (6.6779 both, on an AMD EPYC). rtol 1e-5 is
    # ~7e-5 here; a dummy token counted in the loss moves it by 1.6e-3 to 0.12 (measured, all
    # families), a dummy feature landing on a real token by more.
    torch.testing.assert_close(dummy_loss, plain_loss, rtol=1e-5, atol=0)
    for name, g in _grads(model).items():
        assert g is not None, name
        if name in plain_grads:
            torch.testing.assert_close(g, plain_grads[name], rtol=1e-5, atol=1e-6, msg=name)
        else:  # vision: takes part, contributes exactly nothing
            assert torch.count_nonzero(g) == 0, name


def test_padding_free_equals_padded(tiny):
    seqs = _with_responses(tiny, list(_prompts(tiny).values()))
    padded = collate(seqs, tiny.family, tiny.spec, tiny.pad_id)
    if not tiny.family.padding_free:
        with pytest.raises(ValueError, match="padding-free"):
            collate(seqs, tiny.family, tiny.spec, tiny.pad_id, padding_free=True)
        return
    packed = collate(seqs, tiny.family, tiny.spec, tiny.pad_id, padding_free=True)
    use_packed_attention(tiny.model)  # padded calls still get SDPA (models.packing)
    assert packed.input_ids.shape == (1, sum(len(s.input_ids) for s in seqs))
    with torch.no_grad():
        a = sequence_logprobs(tiny.model, padded, with_entropy=True)
        b = sequence_logprobs(tiny.model, packed, with_entropy=True)
    # Other attention shapes and masks: float32 rounding only (measured <= 1e-6 on |log p| ~ 7);
    # a sequence that saw its neighbour in the packed row, or wrong positions, moves far more.
    for (ra, sa, ea), (rb, sb, eb) in zip(padded.seq_spans, packed.seq_spans):
        torch.testing.assert_close(a.logprobs[ra, sa:ea], b.logprobs[rb, sb:eb], rtol=0, atol=1e-5)
        torch.testing.assert_close(a.entropy[ra, sa:ea], b.entropy[rb, sb:eb], rtol=0, atol=1e-5)


def test_generate_batched_equals_single_and_follows_our_positions(tiny):
    """Left-padded HF generate with our M-RoPE ids: each row decodes as it would alone, and
    greedy tokens are the argmax of a teacher-forced forward over prompt + response.
    (Token equality across batch shapes holds on any CPU: the smallest top-1/top-2 logit gap
    on these paths is 7e-4, float32 rounding between the shapes ~1e-6.)"""
    model, tok = tiny.model, tiny.processor.tokenizer
    prompts = list(_prompts(tiny).values())
    batch = collate(prompts, tiny.family, tiny.spec, tiny.pad_id, padding_side="left", dummy_vision=False)
    width = batch.input_ids.shape[1]
    kw = dict(max_new_tokens=6, do_sample=False, min_new_tokens=6, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        out = model.generate(**batch.model_kwargs(), **kw)[:, width:]
        for k, prompt in enumerate(prompts):
            one = collate([prompt], tiny.family, tiny.spec, tiny.pad_id, padding_side="left", dummy_vision=False)
            alone = model.generate(**one.model_kwargs(), **kw)[0, one.input_ids.shape[1] :]
            assert alone.tolist() == out[k].tolist(), prompt.sample_id

            seq = append_response(prompt, out[k], tiny.spec)
            full = collate([seq], tiny.family, tiny.spec, tiny.pad_id, dummy_vision=False)
            logits = model(**full.model_kwargs()).logits[0]
            logits[:, model.generation_config.eos_token_id] = -torch.inf  # as min_new_tokens does
            greedy = logits[prompt.prompt_len - 1 : -1].argmax(-1)
            assert greedy.tolist() == out[k].tolist(), prompt.sample_id

        # A text-only generation batch with the dummy image (left padding: slot 0) decodes the same.
        text = [prompts[2], prompts[2]]
        plain = collate(text, tiny.family, tiny.spec, tiny.pad_id, padding_side="left", dummy_vision=False)
        dummy = collate(text, tiny.family, tiny.spec, tiny.pad_id, padding_side="left")
        assert dummy.has_dummy_vision and dummy.input_ids[0, 0] == tiny.spec.image_token_id
        a = model.generate(**plain.model_kwargs(), **kw)[:, plain.input_ids.shape[1] :]
        b = model.generate(**dummy.model_kwargs(), **kw)[:, dummy.input_ids.shape[1] :]
        assert torch.equal(a, b)
