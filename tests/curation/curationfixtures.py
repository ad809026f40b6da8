"""Constants and model builders of the curation tests (a module of its own: test modules import
it by name, which a `conftest` cannot be, since every test folder has one)."""

from __future__ import annotations

from pathlib import Path

from easyvideor1.models.tiny import build_tiny_model

# A frame budget small enough for the tiny model and the 112x112 synthetic clips.
VISION = ["--vision", "max_frames=8", "--vision", "video_min_pixels=3136", "--vision", "video_max_pixels=12544",
          "--vision", "video_total_pixels=100352", "--vision", "image_min_pixels=3136",
          "--vision", "image_max_pixels=12544"]
TINY = ["--dtype", "float32", *VISION]
LETTERS = "ABCD"


def letter_model(out: Path, seed: int = 0) -> Path:
    """A tiny Qwen2.5-VL whose every response token is one of A-D, near uniformly.

    The last layer's attention writes a large constant into one residual channel (zero value
    weights, a value bias, an output projection summing it there), so after the final norm the
    hidden state is ~ that channel alone; the LM head reads only that channel, for the four
    letters. A random tiny model never answers a question; this one answers multiple-choice
    questions at chance (1/4) and the others never, so pass rates spread over [0, 1)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    build_tiny_model("qwen2_5_vl", out, seed=seed)
    model = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32)
    ids = [AutoTokenizer.from_pretrained(out).convert_tokens_to_ids(t) for t in LETTERS]
    attn = model.model.language_model.layers[-1].self_attn
    with torch.no_grad():
        attn.v_proj.weight.zero_()
        attn.v_proj.bias.fill_(1000.0)
        attn.o_proj.weight.zero_()
        attn.o_proj.weight[0].fill_(1.0 / attn.o_proj.weight.shape[1])
        model.lm_head.weight.zero_()
        model.lm_head.weight[ids, 0] = 2.0
    model.save_pretrained(out)
    return out
