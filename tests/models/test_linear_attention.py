"""Qwen3.5's Gated DeltaNet layers on packed and group-shared rows (`models.linear_attention`).

Tiny Qwen3.5 models in float32. The language model on one packed row (blocks of 5, 2 (shorter
than the conv kernel, 4), 70 (longer than a 64-token chunk), 9 and 1 tokens) equals each
sequence alone, and the same row without the restart does not; the trainer's log-prob pass
(`training.sequences.forward_logprobs`, the batch of test_shared_prefix: video, image and text
prompts, groups cut across micro-batches) gives packed = padded and shared = plain log-probs
and gradients; the FLA / causal-conv1d calls (fla_reference.py, a CPU reference with their
contracts) equal the pure-torch path; the HF engine's packed prefill decodes as unpacked.
"""

from __future__ import annotations

import copy

import fla_reference as reference
import pytest
import torch
from model_media import make_image, make_sample, make_video
from test_shared_prefix import _batch

from easyvideor1.models import linear_attention as la
from easyvideor1.models.packing import Packing, PaddedRows, packing_blocker, use_packed_attention
from easyvideor1.models.shared_prefix import shared_prefix_blocker
from easyvideor1.prompts import Prompt
from easyvideor1.models.inputs import build_inputs
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.training.sequence_parallel import sequence_parallel_blocker
from easyvideor1.training.sequences import ForwardContext, forward_logprobs, micro_batches

QWEN3_5 = ["qwen3_5", "qwen3_5_moe"]
LOGPROB_TOL = 1e-5  # float32 summation order only (measured <= 1e-6)
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5


def _gdn(model) -> list:
    return [m for m in model.modules() if isinstance(m, tuple(la.GATED_DELTA_NETS.values()))]


def _hidden(model, ids: list[torch.Tensor], packing: bool = True) -> torch.Tensor:
    """[L, H] language-model hidden states of `ids` packed in one row (each its own positions)."""
    row = torch.cat(ids)
    pos = torch.cat([torch.arange(len(x)) for x in ids])
    positions = torch.cat([torch.arange(len(row))[None], pos[None].expand(3, -1)])[:, None]  # [4, 1, L]
    bounds = (0, *torch.tensor([len(x) for x in ids]).cumsum(0).tolist())
    out = model.model.language_model(input_ids=row[None], position_ids=positions, use_cache=False,
                                     packing=Packing(bounds) if packing else None)
    return out.last_hidden_state[0]


@pytest.mark.parametrize("tiny", QWEN3_5, indirect=True)
def test_each_packed_sequence_equals_it_alone(tiny):
    model = tiny.model
    use_packed_attention(model)  # packed attention, and the GDN layers' packing-aware forward
    gdn = _gdn(model)
    assert gdn and all(m.forward.__func__ is la.packed_linear_forward for m in gdn)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(10, 400, (n,), generator=g) for n in (5, 2, 70, 9, 1)]
    with torch.no_grad():
        alone = torch.cat([_hidden(model, [x]) for x in ids])
        packed = _hidden(model, ids)
        assert (packed - alone).abs().max() <= LOGPROB_TOL
        for m in gdn:  # the old behaviour: transformers' forward runs straight along the row
            del m.forward
        try:
            straight = _hidden(model, ids)
        finally:
            la.use_packed_linear_attention(model)
    assert (straight[:5] - alone[:5]).abs().max() <= LOGPROB_TOL  # the first block has nothing before it
    assert (straight[5:7] - alone[5:7]).abs().max() > 1e-3  # the next one inherits its conv inputs and state


@pytest.mark.parametrize("tiny", ["qwen3_5"], indirect=True)
def test_without_packing_it_is_transformers_forward(tiny):
    """Padded batches and generation: a left-padded batch with its mask gives bit-identical outputs."""
    model = tiny.model
    ids = torch.randint(10, 400, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :5] = 0
    with torch.no_grad():
        for m in _gdn(model):
            del m.forward
        try:
            before = model.model.language_model(input_ids=ids, attention_mask=mask).last_hidden_state
        finally:
            assert la.use_packed_linear_attention(model) == len(_gdn(model))
        after = model.model.language_model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(before, after)


def _pass(tiny, batch, packed: bool, shared: bool, micro: int = 3):
    """Log-probs [N, T] and the gradients of a loss weighing every response token differently."""
    model = tiny.model
    use_packed_attention(model)
    model.zero_grad(set_to_none=True)
    ctx = ForwardContext(tiny.family, tiny.spec, tiny.pad_id, micro_batch_size=micro, temperature=1.0,
                         chunk_size=7, shared_prefix=shared, padding_free=packed)
    parts = []
    for idx in micro_batches(list(range(batch.size)), micro):
        logp, _, _ = forward_logprobs(model, batch, idx, ctx)
        w = torch.arange(1, logp.numel() + 1, dtype=torch.float32).reshape(logp.shape) / logp.numel()
        (logp * w).sum().backward()
        parts.append(logp.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return torch.cat(parts), grads


def _assert_same(tiny, batch, got, want):
    (logp, grads), (logp_ref, grads_ref) = got, want
    mask = batch.response_mask
    assert mask.sum() > 20 and logp_ref.abs().max() > 1
    diff = (logp - logp_ref)[mask].abs().max()
    assert diff <= LOGPROB_TOL, f"max |logp diff| {diff:.2e}"
    assert grads.keys() == grads_ref.keys() and any("linear_attn.conv1d" in n for n in grads)
    for name, g in grads_ref.items():
        torch.testing.assert_close(grads[name], g, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("tiny", ["qwen3_5"], indirect=True)
def test_packed_equals_padded(tiny):
    batch = _batch(tiny)
    _assert_same(tiny, batch, _pass(tiny, batch, True, False), _pass(tiny, batch, False, False))


@pytest.mark.parametrize("packed", [True, False], ids=["packed group rows", "right-padded group rows"])
@pytest.mark.parametrize("tiny", ["qwen3_5"], indirect=True)
def test_shared_prompt_equals_plain(tiny, packed):
    batch = _batch(tiny)
    _assert_same(tiny, batch, _pass(tiny, batch, packed, True), _pass(tiny, batch, False, False))


@pytest.mark.parametrize("packed,shared", [(True, True), (True, False), (False, True)],
                         ids=["packed group rows", "packed sequences", "padded group rows"])
@pytest.mark.parametrize("tiny", ["qwen3_5"], indirect=True)
def test_gpu_kernel_calls_equal_the_torch_path(tiny, monkeypatch, packed, shared):
    """fla's chunk_gated_delta_rule and causal_conv1d_fn (as on CUDA with both installed), run by
    their CPU references: the same log-probs and gradients as the pure-torch path."""
    batch = _batch(tiny)
    want = _pass(tiny, batch, packed, shared, micro=4)
    reference.install(monkeypatch)
    la._installed_kernels.cache_clear()
    monkeypatch.setattr(la, "linear_kernels", lambda x: la._installed_kernels())  # as on CUDA
    reference.calls.clear()
    try:
        got = _pass(tiny, batch, packed, shared, micro=4)
    finally:
        la._installed_kernels.cache_clear()
    _assert_same(tiny, batch, got, want)
    kinds = {name for name, _ in reference.calls}
    assert kinds == {"chunk_gated_delta_rule", "causal_conv1d_fn"}
    rules = [cu for name, cu in reference.calls if name == "chunk_gated_delta_rule"]
    assert any(len(cu) > 3 for cu in rules)  # several sequences in one call: varlen, B = 1
    if shared:  # per micro-batch: the prompts (and other blocks), then the responses from their states
        assert len(rules) == 2 * len(micro_batches(list(range(batch.size)), 4))


@pytest.mark.parametrize("tiny", ["qwen3_5"], indirect=True)
def test_hf_engine_prefill_on_packed_rows(tiny):
    """The engine's left-padded prefill on packed attention hands the GDN layers `PaddedRows`: each
    prompt restarts at its first token and the cache holds its own state and conv inputs, so a
    batch decodes exactly as each prompt alone and as the unpacked model."""
    fam = tiny.family
    cases = {"video": [make_video(fam)], "image": [make_image(fam)], "text": []}
    prompts = [Prompt(make_sample(n, f), f, build_inputs(make_sample(n, f), f, "What is shown?", tiny.processor, fam,
                                                         tiny.spec)) for n, f in cases.items()]
    params = SamplingParams(temperature=0, max_tokens=6)
    engine = HFEngine(tiny.model, tiny.processor, fam, tiny.spec)
    model = tiny.model
    model.set_attn_implementation({"text_config": "sdpa"})
    plain = engine.generate(prompts, 1, params)
    use_packed_attention(model)
    seen = []  # what the first GDN layer is handed: the prefill's left-padded rows
    hook = _gdn(model)[0].register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("packing")), with_kwargs=True)
    try:
        packed = engine.generate(prompts, 1, params)
    finally:
        hook.remove()
    assert isinstance(seen[0], PaddedRows) and all(x is None for x in seen[1:])  # decode steps: no packing
    for i, prompt in enumerate(prompts):
        alone = engine.generate([prompt], 1, params)[0][0]
        assert packed[i][0].token_ids == alone.token_ids == plain[i][0].token_ids
        assert max(abs(a - b) for a, b in zip(packed[i][0].logprobs, plain[i][0].logprobs)) < 1e-4


def test_a_subset_of_heads_mixes_as_the_whole():
    """Stage (b) on the conv channels of some key heads (`head_channels`) is that slice of the whole:
    what sequence parallelism's all-to-all over heads relies on."""
    hk, hv, dk, dv, width = 2, 4, 8, 6, 4
    g = torch.Generator().manual_seed(0)
    channels = 2 * hk * dk + hv * dv
    packing = Packing((0, 14, 20), torch.tensor([0] * 6 + [1] * 5 + [2] * 3 + [0] * 6), (True, False))
    mixed, a, b = (torch.randn(1, 20, n, generator=g) for n in (channels, hv, hv))
    weight, a_log, dt = torch.randn(channels, width, generator=g), torch.rand(hv, generator=g), torch.rand(hv, generator=g)
    whole, _ = la.mix_tokens(mixed, a, b, weight, None, a_log, dt, dk, dv, packing)
    ch = la.head_channels([1], hk, hv, dk, dv)
    assert len(ch) == 2 * dk + 2 * dv
    heads = [2, 3]  # key head 1's value heads (repeat_interleave order)
    part, _ = la.mix_tokens(mixed[..., ch], a[..., heads], b[..., heads], weight[ch], None, a_log[heads], dt[heads],
                            dk, dv, packing)
    torch.testing.assert_close(part, whole[:, :, heads], rtol=0, atol=1e-6)


@pytest.mark.parametrize("tiny", QWEN3_5, indirect=True)
def test_blockers(tiny):
    config = tiny.model.config
    assert "linear_attention" in config.get_text_config().layer_types
    assert packing_blocker(config) is None and shared_prefix_blocker(config) is None
    assert "1 linear-attention key heads" in sequence_parallel_blocker(config, 2)  # tiny: 1 key head, never repeated
    other = copy.deepcopy(config)
    other.get_text_config().model_type = "qwen3_next"  # a GDN this forward does not replace
    for why in (packing_blocker(other), shared_prefix_blocker(other)):
        assert why is not None and "'qwen3_next'" in why and "\n" not in why
