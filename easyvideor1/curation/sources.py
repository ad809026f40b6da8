"""Where the k responses come from, and how samples are prepared for it.

    local model (`--model` / `--teacher`): PromptBuilder (frames + training template + processor)
        -> HF engine in batches (`HFBatchBackend`) or vLLM's async engine (`AsyncEngineBackend`)
    endpoint (`--endpoint`): frames + training template -> ChatRequest -> `EndpointBackend`

Both render the prompt text with the training templates (`data.templates.render_prompt`), so the
responses are the ones a training group would see; the frame budget comes from an evaluation
preset (`evaluation.presets`), re-targeted to the model's family, with `--vision` overrides.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from easyvideor1.curation.endpoint import EndpointBackend, EndpointConfig, chat_request
from easyvideor1.curation.frame_budget import vision_config
from easyvideor1.data.templates import render_prompt
from easyvideor1.errors import UserError
from easyvideor1.evaluation.pipeline import AsyncEngineBackend, Backend, HFBatchBackend, Item, Prepare
from easyvideor1.evaluation.settings import template_digest
from easyvideor1.models.families import family_of
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.prompts import PromptBuilder
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.rollout.vllm_engine import AsyncVLLMEngine  # imports vllm only when one is built
from easyvideor1.vision.cache import FrameSource
from easyvideor1.vision.config import VisionConfig


@dataclass
class SourceOptions:
    """How to prepare samples and run the model (what does not change the responses' meaning)."""

    preset: str = "qwen2_5_vl"
    """Evaluation preset whose frame budget is used (`evaluation.presets`)."""
    vision: tuple[str, ...] = ()
    """`field=value` overrides of the preset's VisionConfig (e.g. max_frames=32)."""
    template_dir: str | None = None
    """Prompt template overrides (as `data.template_dir` in training)."""
    cache_dir: str | None = None
    """Frame cache built by `easyvideor1 cache` (None: decode)."""
    cache_mode: str = "prefer_cache"
    """prefer_cache | cache_only | realtime."""
    dtype: str = "bfloat16"
    """Local model dtype."""
    vllm_log: str | None = None
    """vLLM's own logs (and its processes' output) go to this file (None: the console)."""
    max_batch: int = 32
    """HF engine: responses decoded together (k per sample)."""
    max_concurrency: int = 64
    """vLLM engine: requests in flight (the endpoint's is `EndpointConfig.concurrency`)."""


@dataclass
class Source:
    """A ready generation source: the backend, how to prepare an item for it, what identifies it."""

    backend: Backend
    prepare: Prepare
    settings: dict[str, Any]
    """What changes the responses (written to settings.json, checked on resume)."""


def _common_settings(vision: VisionConfig, o: SourceOptions) -> dict[str, Any]:
    flat = {f"vision.{k}": v for k, v in vision.key_params().items()}
    flat["prompt_digest"] = template_digest(o.template_dir)
    return flat


def local_source(model_path: str, engine: str, o: SourceOptions) -> Source:
    """A local HF-format model on the HF engine or vLLM's async engine."""
    from transformers import AutoConfig

    processor = load_processor(model_path)
    config = AutoConfig.from_pretrained(model_path)
    family, spec = family_of(config), mrope_spec(config)
    vision = vision_config(o.preset, family.name, o.vision)
    builder = PromptBuilder(FrameSource(vision, o.cache_dir, o.cache_mode), processor, family, spec,
                            render=partial(render_prompt, template_dir=o.template_dir))
    if engine == "vllm":
        backend = AsyncEngineBackend(AsyncVLLMEngine(model_path, processor, dtype=o.dtype, log_file=o.vllm_log), o.max_concurrency)
    elif engine == "hf":
        model = load_policy(model_path, dtype=o.dtype)
        model.eval()
        backend = HFBatchBackend(HFEngine(model, processor, family, spec, max_batch_size=o.max_batch), o.max_batch)
    else:
        raise UserError(f"engine {engine!r}: choose vllm or hf")

    def prepare(item: Item):
        return builder.build(item.sample)

    settings = {"model": str(model_path), "engine": engine, "dtype": o.dtype, **_common_settings(vision, o)}
    return Source(backend, prepare, settings)


def endpoint_source(cfg: EndpointConfig, o: SourceOptions) -> Source:
    """A teacher behind an OpenAI-compatible server; frames sent as JPEG images with timestamps."""
    vision = vision_config(o.preset, None, o.vision)
    frames = FrameSource(vision, o.cache_dir, o.cache_mode)

    def prepare(item: Item):
        text = render_prompt(item.sample, o.template_dir)
        return chat_request(item.sample, frames.frames_for_sample(item.sample), text, cfg.jpeg_quality)

    settings = {"endpoint": cfg.url, "endpoint_model": cfg.model, **_common_settings(vision, o)}
    return Source(EndpointBackend(cfg), prepare, settings)
