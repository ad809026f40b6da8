"""What differs between the Qwen-VL model families, declared in one place.

Every family-specific number or rule the rest of the package needs is a field here, so a
new family is one entry in `MODEL_FAMILIES`, not a hunt for `if "qwen3" in name` branches. The
M-RoPE rule of each family is a function in `models/mrope.py` (registry `MROPE`), and the
tiny configs are in `models/tiny.py` (registry `TINY_CONFIGS`), both keyed by these names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)

# Chat-template wrappers of one media item, before the processor expands the pad token into
# one token per vision feature. Identical for all four families (and what vLLM expects).
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"


@dataclass(frozen=True)
class Family:
    """One Qwen-VL model family: the facts the package branches on."""

    name: str
    """Our name for the family (the CLI's `--family`)."""
    model_type: str
    """`config.model_type` in transformers."""
    architecture: str
    """The transformers class `AutoModelForImageTextToText` resolves to (`config.architectures`)."""
    processor_class: str
    """The transformers processor class (Qwen3.5 reuses Qwen3-VL's)."""
    video_processor_class: str
    """The transformers video processor class."""
    patch_size: int
    """Vision patch side, pixels."""
    merge_size: int
    """Spatial merge of merge_size x merge_size patches into one LLM token."""
    temporal_patch_size: int
    """Frames folded into one temporal token."""
    video_budget_is_total: bool
    """Video max pixels count over all frames (Qwen3-VL) or per frame (Qwen2/2.5-VL)."""
    image_mean: tuple[float, float, float]
    """Normalisation mean of image and video processors (kept equal: vLLM uses the image one)."""
    image_std: tuple[float, float, float]
    """Normalisation std of image and video processors."""
    timestamps: str
    """How time reaches the LLM: "none" (frame index only, Qwen2-VL), "grid_seconds" (temporal
    M-RoPE ids scaled by `second_per_grid_ts * tokens_per_second`, Qwen2.5-VL) or "frame_text"
    (a `<t seconds>` text before each temporal patch, Qwen3-VL/3.5)."""
    requires_mm_token_type_ids: bool
    """HF forward raises without `mm_token_type_ids` when pixels are passed (5.19)."""
    default_system_prompt: str | None
    """System message the official chat template inserts when the conversation has none."""
    padding_free: bool
    """The text model runs packed rows exactly (`models.packing`, `models.linear_attention`)."""
    moe: bool = False
    """The language model's MLPs are sparse mixture-of-experts blocks (a router picks top-k experts).
    FSDP2 keeps a layer's experts in its unit (`training.fsdp`); LoRA leaves experts and gates
    frozen (`models.lora.GATES`); vLLM and exports get the released expert layout (`models.expert_layout`)."""

    @property
    def grid_factor(self) -> int:
        """Frame sides must be multiples of this (28 for Qwen2/2.5-VL, 32 for Qwen3-VL/3.5)."""
        return self.patch_size * self.merge_size


MODEL_FAMILIES: dict[str, Family] = {
    "qwen2_vl": Family(
        name="qwen2_vl",
        model_type="qwen2_vl",
        architecture="Qwen2VLForConditionalGeneration",
        processor_class="Qwen2VLProcessor",
        video_processor_class="Qwen2VLVideoProcessor",
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        video_budget_is_total=False,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
        timestamps="none",
        requires_mm_token_type_ids=True,
        default_system_prompt="You are a helpful assistant.",
        padding_free=True,
    ),
    "qwen2_5_vl": Family(
        name="qwen2_5_vl",
        model_type="qwen2_5_vl",
        architecture="Qwen2_5_VLForConditionalGeneration",
        processor_class="Qwen2_5_VLProcessor",
        video_processor_class="Qwen2VLVideoProcessor",
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        video_budget_is_total=False,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
        timestamps="grid_seconds",
        requires_mm_token_type_ids=False,
        default_system_prompt="You are a helpful assistant.",
        padding_free=True,
    ),
    "qwen3_vl": Family(
        name="qwen3_vl",
        model_type="qwen3_vl",
        architecture="Qwen3VLForConditionalGeneration",
        processor_class="Qwen3VLProcessor",
        video_processor_class="Qwen3VLVideoProcessor",
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        video_budget_is_total=True,
        image_mean=HALF,
        image_std=HALF,
        timestamps="frame_text",
        requires_mm_token_type_ids=True,
        default_system_prompt=None,
        padding_free=True,
    ),
    "qwen3_5": Family(
        name="qwen3_5",
        model_type="qwen3_5",
        architecture="Qwen3_5ForConditionalGeneration",
        processor_class="Qwen3VLProcessor",
        video_processor_class="Qwen3VLVideoProcessor",
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        video_budget_is_total=True,
        image_mean=HALF,
        image_std=HALF,
        timestamps="frame_text",
        requires_mm_token_type_ids=True,
        default_system_prompt=None,
        padding_free=True,  # its linear-attention layers restart per block (models.linear_attention)
    ),
}

for _dense, _moe_arch in (("qwen3_vl", "Qwen3VLMoeForConditionalGeneration"),
                          ("qwen3_5", "Qwen3_5MoeForConditionalGeneration")):
    # the MoE models share their dense family's processor, vision tower and positions
    MODEL_FAMILIES[f"{_dense}_moe"] = dataclasses.replace(
        MODEL_FAMILIES[_dense], name=f"{_dense}_moe", model_type=f"{_dense}_moe", architecture=_moe_arch, moe=True)


def get_family(name: str) -> Family:
    """The family called `name`; an unknown name is an error listing the known ones."""
    try:
        return MODEL_FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(MODEL_FAMILIES)}") from None


def family_of(config) -> Family:
    """The family of a loaded HF model config (by `config.model_type`)."""
    for family in MODEL_FAMILIES.values():
        if family.model_type == config.model_type:
            return family
    known = ", ".join(f.model_type for f in MODEL_FAMILIES.values())
    raise ValueError(f"model_type {config.model_type!r} is not a supported family; known: {known}")
