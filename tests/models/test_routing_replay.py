"""Rollout routing replay (R3, `models.routing`) on the tiny qwen3_vl_moe and qwen3_5_moe (4 experts,
top-2; Qwen3.5-MoE's `Qwen3_5MoeTopKRouter` beside its gated shared expert and Gated DeltaNet layers), float32.

The engine side is a copy of the model whose routers pick their top-k from noisy logits
(`perturb_selection`): engine and trainer then differ in routing only, as bf16 kernels flipping
near-tied experts do. The parity bound is the dense families' HF engine vs trainer bound,
1e-4 (tests/rollout/test_hf_engine.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import load_balancing_loss_func

from easyvideor1.config_tree import ConfigError
from easyvideor1.models.collate import collate
from easyvideor1.models.families import get_family
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.packing import use_packed_attention
from easyvideor1.models.routing import (
    ROUTE_FREE,
    aux_loss,
    install,
    moe_routers,
    perturb_selection,
    recording,
    release,
    router_settings,
    router_stats,
    routes_applied,
    routes_from_vllm,
)
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.prompts import Prompt
from easyvideor1.records import Frames, Sample, VideoMetadata
from easyvideor1.rollout.base import SamplingParams, banned_token_ids
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.training.sequences import ForwardContext, all_logprobs, forward_logprobs, make_batch

PARITY = 1e-4  # the dense families' engine vs trainer log-prob bound (test_hf_engine.py)
NOISE = 0.05  # selection noise on the engine's router logits: ~18% of (token, layer) routes differ
MOE = ("qwen3_vl_moe", "qwen3_5_moe")  # the routers replayed: Qwen3VLMoeTextTopKRouter, Qwen3_5MoeTopKRouter


class Moe:
    def __init__(self, path, family="qwen3_vl_moe"):
        self.family = get_family(family)
        self.model = load_policy(path, dtype="float32").eval()
        self.processor = load_processor(path)
        self.spec = mrope_spec(self.model.config)
        gate = self.model.model.language_model.layers[0].mlp.gate.weight
        if not bool(gate.abs().sum()):  # a zero-initialised router would tie every expert
            with torch.no_grad():
                for router in moe_routers(self.model):
                    router.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))

    def prompt(self, sample_id: str, frames: list[Frames], text: str) -> Prompt:
        kind = "video" if any(f.metadata for f in frames) else "image" if frames else "text"
        sample = Sample(text, "a", "free-form", kind, problem_id=sample_id,
                        videos=[f.source for f in frames if f.metadata], images=[f.source for f in frames if not f.metadata])
        return Prompt(sample, frames, build_inputs(sample, frames, text, self.processor, self.family, self.spec))

    def prompts(self) -> list[Prompt]:
        g = torch.Generator().manual_seed(0)
        f = self.family.grid_factor
        video = Frames(torch.randint(0, 256, (4, 3, 2 * f, 3 * f), dtype=torch.uint8, generator=g),
                       VideoMetadata(2.0, 8, [0, 2, 4, 6], 3 * f, 2 * f, 4.0, backend="torchcodec"), "v.mp4")
        image = Frames(torch.randint(0, 256, (1, 3, 2 * f, 2 * f), dtype=torch.uint8, generator=g), None, "i.png")
        return [self.prompt("vid", [video], "What moves in the video?"),
                self.prompt("img", [image], "What color is the square?"),
                self.prompt("txt", [], "Count from one to five.")]

    def ctx(self, **kw) -> ForwardContext:
        shape, _ = router_settings("rollout", self.model)
        return ForwardContext(family=self.family, spec=self.spec, pad_token_id=self.processor.tokenizer.pad_token_id,
                              micro_batch_size=kw.pop("micro_batch_size", 1), temperature=1.0, router_shape=shape,
                              banned_ids=tuple(banned_token_ids(self.processor.tokenizer)), **kw)

    def engine_rollouts(self, noise: float, n: int = 2):
        engine_model = copy.deepcopy(self.model)
        perturb_selection(engine_model, noise, seed=3)
        engine = HFEngine(engine_model, self.processor, self.family, self.spec)
        prompts = self.prompts()
        groups = engine.generate(prompts, n, SamplingParams(temperature=1.0, max_tokens=8, seed=1))
        return make_batch(prompts, groups)


@pytest.fixture(scope="module", params=MOE)
def moe(request, tmp_path_factory):
    return Moe(build_tiny_model(request.param, tmp_path_factory.mktemp("moe") / "m", seed=0), request.param)


@pytest.fixture(scope="module")
def noisy_batch(moe):
    return moe.engine_rollouts(NOISE)


def gap(batch, logp) -> float:
    return float((logp - batch.behaviour_log_probs)[batch.response_mask].abs().max())


def test_replaying_the_recorded_routes_reproduces_the_recording_forward(moe):
    """One forward recorded, then replayed: logits bit-equal (R3's weights at the router's own top-k
    are HF's); replaying other experts changes them (the replay is not a no-op)."""
    prompts = moe.prompts()
    batch = collate([p.inputs for p in prompts], moe.family, moe.spec, moe.processor.tokenizer.pad_token_id)
    with torch.no_grad():
        plain = moe.model(**batch.model_kwargs()).logits
        with recording(moe.model) as recorder:
            recorded_logits = moe.model(**batch.model_kwargs()).logits
            routes = recorder.take(tuple(batch.input_ids.shape)).long()
        with routes_applied(moe.model, routes):
            replayed = moe.model(**batch.model_kwargs()).logits
        other = routes.clone()
        other[..., 0] = (routes[..., 1] + 1) % 4 * (routes[..., 1] + 1 != routes[..., 0]) + \
            (routes[..., 1] + 2) % 4 * (routes[..., 1] + 1 == routes[..., 0])
        with routes_applied(moe.model, other):
            shifted = moe.model(**batch.model_kwargs()).logits
    assert torch.equal(plain, recorded_logits) and torch.equal(recorded_logits, replayed)
    assert routes.shape == (*batch.input_ids.shape, 2, 2)
    assert (shifted - plain).abs().max() > 1e-3


def test_replay_brings_the_trainer_to_the_engine_within_the_parity_bound(moe, noisy_batch):
    """Engine routing differs (noisy selection): without replay the trainer's log-probs miss the
    engine's by more than the parity bound; with replay they agree within it."""
    batch = noisy_batch
    assert all(r.routes is not None and r.routes.shape[0] == len(batch.prompts[g].inputs.input_ids) + len(r.token_ids)
               for r, g in zip(batch.rollouts, batch.group_ids.tolist()))
    assert all(int(r.routes[-1].min()) == ROUTE_FREE for r in batch.rollouts)  # the last token: never fed
    without = all_logprobs(moe.model, batch, moe.ctx(routing_replay=False))
    with_replay = all_logprobs(moe.model, batch, moe.ctx(routing_replay=True))
    assert gap(batch, without) > 10 * PARITY, gap(batch, without)
    assert gap(batch, with_replay) < PARITY, gap(batch, with_replay)

    clean = moe.engine_rollouts(0.0)  # the control: one routing, so no replay needed
    assert gap(clean, all_logprobs(moe.model, clean, moe.ctx(routing_replay=False))) < PARITY


def test_router_gets_gradients_and_metrics_under_replay(moe, noisy_batch):
    model = copy.deepcopy(moe.model)
    ctx = moe.ctx(routing_replay=True, micro_batch_size=6)
    logp = forward_logprobs(model, noisy_batch, list(range(noisy_batch.size)), ctx)[0]
    aux = aux_loss(model)
    stats = router_stats(model)
    stats.aux.append(float(aux.detach()))
    logp.sum().backward()
    release(model)
    for router in moe_routers(model):
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
        assert router._ev1_routing.routes is None
    metrics = stats.metrics()
    assert 0.5 < metrics["moe/router_agreement"] < 1.0, metrics  # the noisy engine disagrees on some routes
    assert metrics["moe/expert_load_cv"] > 0 and metrics["moe/aux_loss"] == float(aux.detach()) > 0


def test_packed_shared_and_micro_batches_carry_the_routes(moe, noisy_batch):
    """Padded rows one by one, micro-batches of 4, one packed row, group-shared rows (padded and
    packed): the replayed log-probs are the same, and within the parity bound of the engine's."""
    model = copy.deepcopy(moe.model)
    use_packed_attention(model)
    base = all_logprobs(model, noisy_batch, moe.ctx(routing_replay=True))
    for kw in (dict(micro_batch_size=4), dict(micro_batch_size=6, padding_free=True),
               dict(micro_batch_size=4, shared_prefix=True), dict(micro_batch_size=6, shared_prefix=True,
                                                                  padding_free=True)):
        got = all_logprobs(model, noisy_batch, moe.ctx(routing_replay=True, **kw))
        assert float((got - base).abs().max()) < 1e-5, kw
        assert gap(noisy_batch, got) < PARITY, kw


def test_aux_loss_is_transformers_load_balancing_loss_without_replay(moe):
    batch = collate([p.inputs for p in moe.prompts()], moe.family, moe.spec, moe.processor.tokenizer.pad_token_id)
    install(moe.model)
    with torch.no_grad(), routes_applied(moe.model, None, collect=True):
        moe.model(**batch.model_kwargs())
        probs = [router._ev1_routing.seen[0] for router in moe_routers(moe.model)]
        got = aux_loss(moe.model)
    expected = load_balancing_loss_func(tuple(p.log() for p in probs), 4, 2)
    assert moe_routers(moe.model)[0]._ev1_routing.seen is None  # released on exit without gradients
    assert torch.allclose(got, expected, atol=1e-6), (got, expected)


def test_vllm_routes_become_rollout_routes():
    """vLLM's [seq_len, layers, k] (prompt and every fed token) padded to prompt + response."""
    given = torch.arange(5 * 2 * 2).reshape(5, 2, 2) % 4
    routes = routes_from_vllm(given.numpy(), prompt_len=3, response_len=3)
    assert routes.dtype == torch.int16 and routes.shape == (6, 2, 2)
    assert torch.equal(routes[:5].long(), given) and (routes[5] == ROUTE_FREE).all()
    assert routes_from_vllm(None, 3, 3) is None


def test_replay_under_sequence_parallelism_is_refused(moe):
    """A row split over sequence-parallel ranks is routed by share, which recorded routes do not follow
    yet: `algorithm.routing_replay=rollout` stops at set-up in one line naming both settings (what
    `training.setup` raises under `training.sequence_parallel_size > 1`); `none` trains under SP
    (tests/models/test_ulysses.py runs Qwen3-VL-MoE so) with no router metrics."""
    with pytest.raises(ConfigError) as refused:
        router_settings("rollout", moe.model, sequence_parallel=True)
    assert str(refused.value) == ("algorithm.routing_replay=rollout does not support training.sequence_parallel_size "
                                  "> 1 yet; set algorithm.routing_replay=none or training.sequence_parallel_size=1")
    assert router_settings("none", moe.model, sequence_parallel=True) == (None, False)
    assert router_settings("rollout", moe.model) == ((2, 2), True)
