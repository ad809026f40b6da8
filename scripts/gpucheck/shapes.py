"""The models and workloads of the GPU check: each model built from its config alone with random
weights (no hub: the released architectures' numbers are written here), a small tokenizer and the
family's processor; the vocabulary keeps its real size so embedding and lm_head cost is real."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

@dataclass(frozen=True)
class Shape:
    """The numbers of one model to build (text = the LLM, vision = the ViT tower)."""

    family: str
    vocab_size: int
    text_hidden: int
    text_intermediate: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    head_dim: int
    rope_theta: float
    mrope_section: tuple[int, int, int]
    tie_embeddings: bool
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    vision_extra: dict = field(default_factory=dict)
    released_text_layers: int = 0  # depth of the released model (0: same as text_layers)


# From the released config.json files (Qwen/Qwen2.5-VL-3B-Instruct, Qwen/Qwen3-VL-8B-Instruct,
# Qwen/Qwen2.5-VL-7B-Instruct; the 7B's vision tower is the 3B's).
_QWEN2_5_VISION = dict(window_size=112, fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2,
                       hidden_act="silu")
SHAPES: dict[str, Shape] = {
    "qwen2_5_vl_3b": Shape(
        family="qwen2_5_vl", vocab_size=151936, text_hidden=2048, text_intermediate=11008, text_layers=36,
        text_heads=16, text_kv_heads=2, head_dim=128, rope_theta=1e6, mrope_section=(16, 24, 24),
        tie_embeddings=True, vision_depth=32, vision_hidden=1280, vision_intermediate=3420, vision_heads=16,
        vision_extra=_QWEN2_5_VISION),
    "qwen3_vl_8b": Shape(
        family="qwen3_vl", vocab_size=151936, text_hidden=4096, text_intermediate=12288, text_layers=18,
        text_heads=32, text_kv_heads=8, head_dim=128, rope_theta=5e6, mrope_section=(24, 20, 20),
        tie_embeddings=False, vision_depth=27, vision_hidden=1152, vision_intermediate=4304, vision_heads=16,
        vision_extra=dict(num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
                          hidden_act="gelu_pytorch_tanh"),
        released_text_layers=36),
    # The realistic row (issue 26): 7B widths, 18 of 28 layers so states + activations fit one H200.
    "qwen2_5_vl_7b": Shape(
        family="qwen2_5_vl", vocab_size=152064, text_hidden=3584, text_intermediate=18944, text_layers=18,
        text_heads=28, text_kv_heads=4, head_dim=128, rope_theta=1e6, mrope_section=(16, 24, 24),
        tie_embeddings=False, vision_depth=32, vision_hidden=1280, vision_intermediate=3420, vision_heads=16,
        vision_extra=_QWEN2_5_VISION, released_text_layers=28),
}

# The same structures, small, for --tiny (CPU logic check). The vocabulary stays larger than
# the tokenizer (818 tokens), as in the real-shape models, so sampled ids outside it occur.
TINY_SHAPES: dict[str, Shape] = {
    "qwen2_5_vl_3b": replace(SHAPES["qwen2_5_vl_3b"], vocab_size=4096, text_hidden=64, text_intermediate=128,
                             text_layers=2, text_heads=2, text_kv_heads=1, head_dim=32, mrope_section=(4, 6, 6),
                             vision_depth=2, vision_hidden=32, vision_intermediate=64, vision_heads=2,
                             vision_extra={**SHAPES["qwen2_5_vl_3b"].vision_extra, "fullatt_block_indexes": [1]}),
    "qwen3_vl_8b": replace(SHAPES["qwen3_vl_8b"], vocab_size=4096, text_hidden=64, text_intermediate=128,
                           text_layers=2, text_heads=2, text_kv_heads=1, head_dim=32, mrope_section=(6, 5, 5),
                           vision_depth=2, vision_hidden=32, vision_intermediate=64, vision_heads=2,
                           vision_extra={**SHAPES["qwen3_vl_8b"].vision_extra, "num_position_embeddings": 256,
                                         "deepstack_visual_indexes": [0]},
                           released_text_layers=0),
    "qwen2_5_vl_7b": replace(SHAPES["qwen2_5_vl_7b"], vocab_size=4096, text_hidden=64, text_intermediate=128,
                             text_layers=2, text_heads=4, text_kv_heads=2, head_dim=16, mrope_section=(2, 3, 3),
                             vision_depth=2, vision_hidden=32, vision_intermediate=64, vision_heads=2,
                             vision_extra={**_QWEN2_5_VISION, "fullatt_block_indexes": [1]}, released_text_layers=0),
}


@dataclass(frozen=True)
class Workload:
    """Data and batch sizes of the check."""

    clip_side: int  # synthetic frame side, pixels (a multiple of 28 and 32)
    clip_seconds: int  # at 8 fps source, sampled at 2 fps
    prompts: int  # prompts per step: videos and images alternate (TASKS)
    n: int  # responses per prompt
    micro: int  # sequences per forward/backward
    max_tokens: int  # random weights never stop early: every response is this long
    tasks: tuple[str, ...] = ("colour", "image_colour", "count", "image_count")  # video, image, ...
    max_prompt_tokens: int = 8192  # data.max_prompt_tokens


# real/tiny: 448 px clips of 8 s (16 frames, ~2k-token prompts), 128-token responses, 2 prompts'
# groups per micro-batch. long (the realistic row): one 64 s clip at 2 fps = 128 frames of 448 px
# = 64 x 256 = 16,384 video tokens, 8 responses of 1,024 tokens, the whole group in one
# micro-batch (one shared-prefix block of ~24.6k tokens).
WORKLOADS = {"real": Workload(448, 8, 8, 4, 8, 128), "tiny": Workload(112, 4, 4, 2, 4, 12),
             "long": Workload(448, 64, 1, 8, 8, 1024, ("colour",), 20000),
             "long_tiny": Workload(112, 8, 1, 4, 4, 16, ("colour",), 20000)}
LONG = {"qwen2_5_vl_7b"}  # models run with the long workload


def workload(name: str, tiny: bool) -> Workload:
    """The workload of model `name` (tiny: its small CPU version)."""
    base = "long" if name in LONG else "real"
    return WORKLOADS[(base + "_tiny") if tiny and base == "long" else "tiny" if tiny else base]


def hf_config(shape: Shape, tokens: dict[str, int]):
    """The transformers config of `shape` (token ids from the small tokenizer)."""
    import transformers

    text = dict(vocab_size=shape.vocab_size, hidden_size=shape.text_hidden,
                intermediate_size=shape.text_intermediate, num_hidden_layers=shape.text_layers,
                num_attention_heads=shape.text_heads, num_key_value_heads=shape.text_kv_heads,
                rms_norm_eps=1e-6, max_position_embeddings=128000,
                eos_token_id=tokens["<|im_end|>"], pad_token_id=tokens["<|endoftext|>"],
                bos_token_id=tokens["<|endoftext|>"],
                rope_parameters=dict(rope_type="default", rope_theta=shape.rope_theta,
                                     mrope_section=list(shape.mrope_section)))
    vision = dict(depth=shape.vision_depth, hidden_size=shape.vision_hidden,
                  intermediate_size=shape.vision_intermediate, num_heads=shape.vision_heads,
                  out_hidden_size=shape.text_hidden, spatial_merge_size=2, temporal_patch_size=2,
                  **shape.vision_extra)
    if shape.family == "qwen3_vl":
        text["head_dim"] = shape.head_dim
        text["rope_parameters"]["mrope_interleaved"] = True
        vision["patch_size"] = 16
        cls = transformers.Qwen3VLConfig
    elif shape.family == "qwen2_5_vl":
        vision["patch_size"] = 14
        cls = transformers.Qwen2_5_VLConfig
    else:
        raise ValueError(f"no config builder for family {shape.family!r}")
    return cls(text_config=text, vision_config=vision, tie_word_embeddings=shape.tie_embeddings,
               image_token_id=tokens["<|image_pad|>"], video_token_id=tokens["<|video_pad|>"],
               vision_start_token_id=tokens["<|vision_start|>"], vision_end_token_id=tokens["<|vision_end|>"])


def build_model_dir(shape: Shape, out: Path, device) -> int:
    """Write config + bf16 random weights + tokenizer + processor to `out`; return the parameter count."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    from easyvideor1.models.families import get_family
    from easyvideor1.models.tiny import build_processor
    from easyvideor1.models.tokenizer import SPECIAL_TOKENS, build_tokenizer, chat_template

    fam = get_family(shape.family)
    tokenizer = build_tokenizer(chat_template(fam.default_system_prompt))
    tokens = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = hf_config(shape, tokens)
    config.architectures = [fam.architecture]
    torch.manual_seed(0)
    with torch.device(device):  # random init on the GPU: seconds instead of minutes on CPU
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    end, im_end = tokens["<|endoftext|>"], tokens["<|im_end|>"]
    model.generation_config = GenerationConfig(bos_token_id=end, pad_token_id=end, eos_token_id=[im_end, end])
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    build_processor(fam, tokenizer).save_pretrained(out)
    del model
    return n_params


