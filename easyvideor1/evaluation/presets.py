"""Ready evaluation settings: the video budgets and sampling parameters Qwen published.

Sources (looked up 2026-11; values copied, not derived):
- Video budgets: `qwen-vl-utils/src/qwen_vl_utils/vision_process.py` in QwenLM/Qwen2.5-VL
  (FPS=2, FPS_MIN_FRAMES=4, FPS_MAX_FRAMES=768, VIDEO_MIN_PIXELS=128*28*28,
  VIDEO_MAX_PIXELS=768*28*28, VIDEO_TOTAL_PIXELS=128000*28*28*0.9, images 4..16384*28*28) and
  in QwenLM/Qwen3-VL (the same in tokens of 32x32 pixels: VIDEO_MIN_TOKEN_NUM=128,
  VIDEO_MAX_TOKEN_NUM=768, total = MODEL_SEQ_LEN(128000)*32*32*0.9, images 4..16384 tokens).
- Sampling: Qwen2.5-VL-*-Instruct `generation_config.json` (temperature 0.1, top_p 0.001,
  top_k 1, repetition_penalty 1.05: in effect greedy); the Qwen3-VL model cards' recommended
  settings (instruct: temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.0,
  presence_penalty 1.5, out_seq_length 16384 for VL tasks; thinking: temperature 1.0,
  top_p 0.95, top_k 20, presence_penalty 0.0, out_seq_length 40960).

- Qwen2-VL (`qwen2_vl*`): the qwen-vl-utils of the Qwen2-VL release (QwenLM/Qwen2.5-VL history,
  commit 810c5a9, 2024-08-30: the same constants as above but VIDEO_TOTAL_PIXELS=24576*28*28);
  sampling from Qwen2-VL-*-Instruct `generation_config.json` (temperature 0.01, top_p 0.001,
  top_k 1, repetition_penalty 1.05; recalled, not re-read here: Hugging Face is unreachable).
- Qwen3.5 (`qwen3_5*`): its processor is Qwen3-VL's (32x32-pixel tokens), so the Qwen3-VL
  budget with the qwen3_5 grid; sampling from the Qwen3.5 model cards' best practices as quoted
  verbatim at fakoli.github.io/anvil-serving/MODEL-SETTINGS-EXAMPLE (instruct/general:
  temperature 0.7, top_p 0.8, top_k 20, presence_penalty 1.5, repetition_penalty 1.0;
  thinking/general: temperature 1.0, top_p 0.95, top_k 20, presence_penalty 1.5).

Departure: the published out_seq_lengths (16384 / 40960) are far beyond what benchmarks need
and what the paper's runs used, so the presets cap responses at 4096 tokens (8192 for
thinking); pass `sampling=` to `settings()` to change it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from easyvideor1.config_tree import ConfigError
from easyvideor1.evaluation.settings import DecodingSettings, EvalSettings
from easyvideor1.models.families import get_family
from easyvideor1.vision.config import VisionConfig

_QWEN2_TOKEN = 28 * 28  # pixels of one merged Qwen2/2.5-VL vision token
_QWEN3_TOKEN = 32 * 32  # pixels of one merged Qwen3-VL / Qwen3.5 vision token


@dataclass(frozen=True)
class Preset:
    """A named pair of frame budget and sampling parameters."""

    vision: VisionConfig
    """Frame sampling and pixel budgets."""
    sampling: DecodingSettings
    """Decoding parameters."""
    source: str
    """Where the values come from."""


QWEN2_5_VL_VISION = VisionConfig(
    family="qwen2_5_vl", fps=2.0, min_frames=4, max_frames=768,
    video_min_pixels=128 * _QWEN2_TOKEN, video_max_pixels=768 * _QWEN2_TOKEN,
    video_total_pixels=int(128000 * _QWEN2_TOKEN * 0.9),
    image_min_pixels=4 * _QWEN2_TOKEN, image_max_pixels=16384 * _QWEN2_TOKEN,
)
QWEN2_VL_VISION = dataclasses.replace(QWEN2_5_VL_VISION, family="qwen2_vl",
                                      video_total_pixels=24576 * _QWEN2_TOKEN)
QWEN3_VL_VISION = VisionConfig(
    family="qwen3_vl", fps=2.0, min_frames=4, max_frames=768,
    video_min_pixels=128 * _QWEN3_TOKEN, video_max_pixels=768 * _QWEN3_TOKEN,
    video_total_pixels=int(128000 * _QWEN3_TOKEN * 0.9),
    image_min_pixels=4 * _QWEN3_TOKEN, image_max_pixels=16384 * _QWEN3_TOKEN,
)

QWEN2_5_VL_SAMPLING = DecodingSettings(temperature=0.1, top_p=0.001, top_k=1,
                                     repetition_penalty=1.05, max_new_tokens=4096)
QWEN3_VL_SAMPLING = DecodingSettings(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.0,
                                   presence_penalty=1.5, max_new_tokens=4096)
QWEN3_VL_THINKING_SAMPLING = DecodingSettings(temperature=1.0, top_p=0.95, top_k=20,
                                            presence_penalty=0.0, max_new_tokens=8192)
QWEN2_VL_SAMPLING = DecodingSettings(temperature=0.01, top_p=0.001, top_k=1,
                                     repetition_penalty=1.05, max_new_tokens=4096)
QWEN3_5_SAMPLING = DecodingSettings(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.0,
                                    presence_penalty=1.5, max_new_tokens=4096)
QWEN3_5_THINKING_SAMPLING = DecodingSettings(temperature=1.0, top_p=0.95, top_k=20, presence_penalty=1.5,
                                             max_new_tokens=8192)
GREEDY = DecodingSettings(temperature=0.0, max_new_tokens=4096)
QWEN3_5_VISION = dataclasses.replace(QWEN3_VL_VISION, family="qwen3_5")

EVAL_PRESETS: dict[str, Preset] = {
    "qwen2_5_vl": Preset(QWEN2_5_VL_VISION, QWEN2_5_VL_SAMPLING,
                         "QwenLM/Qwen2.5-VL qwen-vl-utils; Qwen2.5-VL-Instruct generation_config.json"),
    "qwen2_5_vl_greedy": Preset(QWEN2_5_VL_VISION, GREEDY,
                                "QwenLM/Qwen2.5-VL qwen-vl-utils; greedy decoding"),
    "qwen2_vl": Preset(QWEN2_VL_VISION, QWEN2_VL_SAMPLING,
                       "Qwen2-VL-era qwen-vl-utils; Qwen2-VL-Instruct generation_config.json"),
    "qwen2_vl_greedy": Preset(QWEN2_VL_VISION, GREEDY, "Qwen2-VL-era qwen-vl-utils; greedy decoding"),
    "qwen3_vl": Preset(QWEN3_VL_VISION, QWEN3_VL_SAMPLING,
                       "QwenLM/Qwen3-VL qwen-vl-utils; Qwen3-VL instruct model card"),
    "qwen3_vl_thinking": Preset(QWEN3_VL_VISION, QWEN3_VL_THINKING_SAMPLING,
                                "QwenLM/Qwen3-VL qwen-vl-utils; Qwen3-VL thinking model card"),
    "qwen3_vl_greedy": Preset(QWEN3_VL_VISION, GREEDY,
                              "QwenLM/Qwen3-VL qwen-vl-utils; greedy decoding"),
    "qwen3_5": Preset(QWEN3_5_VISION, QWEN3_5_SAMPLING,
                      "QwenLM/Qwen3-VL qwen-vl-utils (Qwen3.5 uses its processor); Qwen3.5 model card, instruct"),
    "qwen3_5_thinking": Preset(QWEN3_5_VISION, QWEN3_5_THINKING_SAMPLING,
                               "QwenLM/Qwen3-VL qwen-vl-utils; Qwen3.5 model card, thinking"),
    "qwen3_5_greedy": Preset(QWEN3_5_VISION, GREEDY, "QwenLM/Qwen3-VL qwen-vl-utils; greedy decoding"),
}


def get_preset(name: str) -> Preset:
    """The preset called `name`; an unknown name is an error listing the known ones."""
    if name not in EVAL_PRESETS:
        raise ValueError(f"unknown evaluation preset {name!r}; choose one of {', '.join(EVAL_PRESETS)}")
    return EVAL_PRESETS[name]


@dataclass(frozen=True)
class Overrides:
    """Changes to a preset: a trained model's own settings (`models.model_settings`), then the
    command line's (`eval --max-new-tokens/--fps/...`, the frame flags named as `cache`'s); None
    keeps the preset's value. They land in `EvalSettings`, so the settings hash records them."""

    max_new_tokens: int | None = None
    """Response length limit, tokens."""
    fps: float | None = None
    """Frames sampled per second of video."""
    min_frames: int | None = None
    """Fewest frames sampled from a video."""
    max_frames: int | None = None
    """Most frames sampled from a video."""
    video_min_pixels: int | None = None
    """Lower bound on H*W of each video frame."""
    video_max_pixels: int | None = None
    """Upper bound on H*W of each video frame (lowers the minimum in force when below it)."""
    video_total_pixels: int | None = None
    """Budget over the whole video."""
    image_min_pixels: int | None = None
    """Lower bound on H*W of an image."""
    image_max_pixels: int | None = None
    """Upper bound on H*W of an image (lowers the minimum in force when below it)."""

    def given(self) -> dict[str, Any]:
        """The fields set, {name: value}."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def flags(self) -> dict[str, Any]:
        """The overrides given, as {command-line flag: value}."""
        return {EVAL_FLAGS.get(k, "--" + k.replace("_", "-")): v for k, v in self.given().items()}

    def over(self, base: Overrides) -> Overrides:
        """These values on top of `base`'s (`layered`)."""
        return Overrides(**layered(base.given(), self.given()))


EVAL_FLAGS = {"max_frames": "--video-max-frames"}  # a field whose `eval` flag is not its name (cache's)
# (minimum, maximum): a maximum given below the minimum in force lowers it, unless that is given too
BOUNDS = (("min_frames", "max_frames"), ("video_min_pixels", "video_max_pixels"),
          ("image_min_pixels", "image_max_pixels"))


def layered(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top`'s values over `base`'s. A maximum in `top` below `base`'s minimum lowers that minimum
    with it (what asking for smaller frames means), unless `top` gives the minimum too."""
    out = {**base, **top}
    for lo, hi in BOUNDS:
        if hi in top and lo not in top and lo in out and out[lo] > top[hi]:
            out[lo] = top[hi]
    return out


def settings(preset: str, model_path: str, engine: str = "vllm", *,
             prompt_template: str = "builtin", prompt_digest: str = "", judge: str = "",
             family: str | None = None, sampling: DecodingSettings | None = None,
             overrides: Overrides | None = None) -> EvalSettings:
    """`EvalSettings` from a preset. `family` re-targets the frame budget's grid (e.g. a Qwen3.5
    model under the Qwen3-VL budget); `sampling` replaces the preset's decoding parameters;
    `overrides` then changes single values (an impossible combination is a ConfigError naming
    the flags)."""
    p = get_preset(preset)
    vision = dataclasses.replace(p.vision, family=family) if family else dataclasses.replace(p.vision)
    sampling = sampling or p.sampling
    o = overrides or Overrides()
    frames = {k: v for k, v in o.given().items() if k != "max_new_tokens"}
    try:
        current = {k: getattr(vision, k) for k in frames.keys() | {k for pair in BOUNDS for k in pair}}
        vision = dataclasses.replace(vision, **layered(current, frames))
        if o.max_new_tokens is not None:
            sampling = dataclasses.replace(sampling, max_new_tokens=o.max_new_tokens)
    except ValueError as e:
        given = " ".join(f"{k} {v}" for k, v in o.flags().items())
        raise ConfigError(f"{given} does not fit preset {preset!r}: {e}") from None
    return EvalSettings(model_path=model_path, engine=engine, vision=vision,
                        sampling=sampling, prompt_template=prompt_template,
                        prompt_digest=prompt_digest, judge=judge)


DEFAULT_PRESET = "qwen2_5_vl_greedy"  # `eval`'s, for a model that carries no settings of its own
DEFAULT_DTYPE = "bfloat16"
# What `eval --settings-from` takes (`carried.load_source`).
SOURCE_HELP = ("a model folder carrying easyvideor1.json (written by train, demo and export), a training run or "
               "demo folder, a checkpoint folder, or a training YAML config")
TEXT_TOKENS = 2048  # room for the question, options, system prompt and chat template
MEDIA_LIMIT = {"video": 1, "image": 2}  # media per prompt the vLLM engine is built for


def default_max_model_len(s: EvalSettings, model_config: Any = None) -> int:
    """vLLM's `max_model_len` for these settings: the video budget's tokens (total pixels over
    the grid factor squared), two images at their pixel cap, the question and the response;
    capped at the model's `max_position_embeddings` when `model_config` names it."""
    v = s.vision
    g2 = get_family(v.family).grid_factor ** 2
    need = (MEDIA_LIMIT["video"] * v.video_total_pixels // g2 + MEDIA_LIMIT["image"] * v.image_max_pixels // g2
            + TEXT_TOKENS + s.sampling.max_new_tokens)
    text = getattr(model_config, "text_config", model_config)
    cap = getattr(text, "max_position_embeddings", None)
    return min(need, cap) if cap else need
