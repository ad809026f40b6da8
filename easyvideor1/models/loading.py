"""Load a policy, a frozen reference and the processor from a local HF-format directory.

Everything goes through `AutoModelForImageTextToText` / `AutoProcessor`, so the four families
load the same way; what differs per family is read from `families.family_of(config)`. No
global patching of transformers: family quirks are handled where the inputs are built. With
`sdpa`, the vision tower's attention is `vision_attention.window_attention` (registered in
transformers' attention interface); the patch embedding is a matmul (`patch_embed.PatchLinear`,
set on the loaded model's own modules).
"""

from __future__ import annotations

from pathlib import Path

import torch

from easyvideor1.models.meta_init import empty_model
from easyvideor1.models.patch_embed import use_linear_patch_embed
from easyvideor1.models.vision_attention import use_window_attention

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`torch.dtype` from a name in `DTYPES` (or a dtype, returned as is)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}") from None


def _load(path: str | Path, dtype, attn_implementation: str, device: str | torch.device):
    from transformers import AutoModelForImageTextToText

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no config.json in {path}: expected a local HF model directory "
            f"(build one with `easyvideor1 tiny-model --family qwen2_5_vl --out {path}`)"
        )
    if torch.device(device).type == "meta":  # built, not read: `models.meta_init.fill_weights` loads it
        model = empty_model(path, resolve_dtype(dtype), attn_implementation)
    else:
        model = AutoModelForImageTextToText.from_pretrained(
            path, dtype=resolve_dtype(dtype), attn_implementation=attn_implementation
        )
    if attn_implementation == "sdpa":  # the vision tower: one call per window size, not per window
        use_window_attention(model)
    use_linear_patch_embed(model)  # the patch Conv3d as one matmul on its own weight (models/patch_embed.py)
    return model if torch.device(device).type == "meta" else model.to(device)


def load_policy(
    path: str | Path,
    dtype: str | torch.dtype = "bfloat16",
    attn_implementation: str = "sdpa",
    freeze_vision: bool = False,
    gradient_checkpointing: bool = False,
    device: str | torch.device = "cpu",
):
    """The trainable policy in train mode (`device="meta"`: built without weights, for
    `models.meta_init.fill_weights` after sharding).

    `freeze_vision` turns off gradients of the whole vision tower (patch embedding, blocks,
    merger, deepstack mergers); the tower still runs in every forward. `gradient_checkpointing`
    recomputes decoder (and vision) blocks in backward (non-reentrant).
    """
    model = _load(path, dtype, attn_implementation, device)
    model.train()
    if freeze_vision:
        for p in vision_tower(model).parameters():
            p.requires_grad_(False)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model


def load_reference(
    path: str | Path,
    dtype: str | torch.dtype = "bfloat16",
    attn_implementation: str = "sdpa",
    device: str | torch.device = "cpu",
):
    """A frozen copy for KL penalties: eval mode, no parameter requires grad."""
    model = _load(path, dtype, attn_implementation, device)
    model.eval()
    model.requires_grad_(False)
    return model


def load_processor(path: str | Path):
    """The model's processor (tokenizer + image + video processor), loaded offline."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(Path(path))


def vision_tower(model) -> torch.nn.Module:
    """The vision encoder of a loaded Qwen-VL model (`model.model.visual` in transformers 5)."""
    return model.model.visual
