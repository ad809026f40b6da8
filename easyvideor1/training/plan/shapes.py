"""The shape of a model, read from its config.json without loading a weight (for `easyvideor1 plan`).

`read_shape(path_or_name)` takes a local model folder (or a config.json), a name of the built-in
table `KNOWN_CONFIGS` (the official config.json of the models the shipped GPU configs name, hub
id or folder name), or a family name (`tiny:qwen2_5_vl`: the tiny model `easyvideor1 demo`
builds). It builds the model on the meta device, which allocates nothing, so the parameter counts
are exact for every family (vision tower, merger and deepstack mergers included), and reads the
language model's widths for the activation formula (`plan.memory`). Mixture-of-experts models
(`qwen3_vl_moe`, `qwen3_5_moe`) are read from their modules: a sparse layer's routed experts are
two tensors, `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I], beside the router [E, H] and
(Qwen3.5-MoE) a shared expert and its gate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from easyvideor1.models.families import MODEL_FAMILIES
from easyvideor1.models.tiny import SIZES, TINY_CONFIGS
from easyvideor1.models.tokenizer import SPECIAL_TOKENS

# The official config.json of the models the shipped 8-GPU configs train (fields that decide the
# shapes; copied from the hub's Qwen/Qwen2.5-VL-7B-Instruct, Qwen/Qwen3-VL-8B-Instruct and
# Qwen/Qwen3-VL-30B-A3B-Instruct; the last checked against copies of its config.json in public code,
# e.g. the one uploaded with huggingface.co/CserDu123/CameraMovement commit 543cf19, and Megatron's
# model arguments for it: 48 layers, hidden 2048, 32/4 heads, 128 experts of 768, top-8).
KNOWN_CONFIGS: dict[str, dict] = {
    "Qwen2.5-VL-7B-Instruct": {
        "model_type": "qwen2_5_vl", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
        "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 128000, "tie_word_embeddings": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                          "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                          "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                          "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
                          "temporal_patch_size": 2},
    },
    "Qwen3-VL-8B-Instruct": {
        "model_type": "qwen3_vl", "tie_word_embeddings": False,
        "text_config": {"attention_bias": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
                        "intermediate_size": 12288, "max_position_embeddings": 262144, "model_type": "qwen3_vl_text",
                        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
                        "rms_norm_eps": 1e-6, "rope_theta": 5000000, "vocab_size": 151936,
                        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                         "rope_type": "default"}},
        "vision_config": {"deepstack_visual_indexes": [8, 16, 24], "depth": 27, "hidden_act": "gelu_pytorch_tanh",
                          "hidden_size": 1152, "in_channels": 3, "intermediate_size": 4304, "model_type": "qwen3_vl",
                          "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 4096,
                          "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2},
    },
    "Qwen3-VL-30B-A3B-Instruct": {
        "model_type": "qwen3_vl_moe", "tie_word_embeddings": False,
        "text_config": {"attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu",
                        "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 262144,
                        "mlp_only_layers": [], "model_type": "qwen3_vl_moe_text", "moe_intermediate_size": 768,
                        "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
                        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
                        "rms_norm_eps": 1e-6, "rope_theta": 5000000, "vocab_size": 151936,
                        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                         "rope_type": "default"}},
        "vision_config": {"deepstack_visual_indexes": [8, 16, 24], "depth": 27, "hidden_act": "gelu_pytorch_tanh",
                          "hidden_size": 1152, "in_channels": 3, "intermediate_size": 4304,
                          "model_type": "qwen3_vl_moe", "num_heads": 16, "num_position_embeddings": 2304,
                          "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2,
                          "temporal_patch_size": 2},
    },
}
TINY_PREFIX = "tiny:"  # `tiny:FAMILY[:SIZE]`: the shape of `models.tiny.build_tiny_model(FAMILY, size=SIZE)`


@dataclass(frozen=True)
class ModelShape:
    """What the memory plan needs of a model: widths of its language model and vision tower, exact counts."""

    source: str
    """Where the shape came from (a config.json path, the built-in table, the tiny builder)."""
    model_type: str
    """`config.model_type`."""
    hidden: int
    """Language model hidden size H."""
    layers: int
    """Decoder layers L."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (grouped-query attention)."""
    head_dim: int
    """Width of one head."""
    intermediate: int
    """MLP intermediate width a token passes through, I (MoE: top-k x expert width + shared expert)."""
    vocab: int
    """Vocabulary size V (lm_head rows)."""
    qk_norm: bool
    """Per-head RMSNorm on q and k (Qwen3-VL, Qwen3.5)."""
    vision_hidden: int
    """Vision tower width W."""
    vision_layers: int
    """Vision tower blocks."""
    vision_heads: int
    """Vision tower heads."""
    vision_intermediate: int
    """Vision MLP intermediate size."""
    vision_gated: bool
    """Vision MLP is gated (gate/up/down, Qwen2.5-VL) or fc1/fc2 (Qwen2-VL, Qwen3-VL)."""
    merge: int
    """Spatial merge side: merge^2 patches make one LLM vision token."""
    patch_values: int
    """Values of one patch, the vision tower's input (channels x temporal patch x patch side^2)."""
    parameters: int
    """All parameters, lm_head counted apart from the embedding (training unties them)."""
    vision_parameters: int
    """Parameters of the vision tower with its merger(s)."""
    largest_unit: int
    """Parameters of the largest FSDP unit (a decoder layer, a vision block or lm_head)."""
    root_unit: int
    """Parameters of the root FSDP unit, what no layer, block or lm_head holds (embedding, patch embedding, merger(s), norms): gathered for the whole step."""
    lora_candidates: tuple[tuple[str, int, int], ...]
    """(qualified name, in features, out features) of every linear layer (LoRA adapts some of them)."""
    experts: int = 0
    """Routed experts E of a sparse MoE layer (0: dense MLPs)."""
    top_k: int = 0
    """Experts each token is routed to."""
    expert_intermediate: int = 0
    """Width I of one expert: gate_up_proj [E, 2I, H], down_proj [E, H, I]."""
    shared_intermediate: int = 0
    """Width of the shared expert every token passes through besides its top-k (Qwen3.5-MoE; 0: none)."""
    sparse_layers: int = 0
    """Decoder layers whose MLP is a sparse MoE block."""
    expert_parameters: int = 0
    """Parameters of the routed experts of all sparse layers (E x 3HI each; router and shared expert apart)."""
    unit_experts: int = 0
    """Routed-expert parameters of the largest FSDP unit (E x 3HI when it is a sparse layer, else 0)."""

    @property
    def active_parameters(self) -> int:
        """Language-model parameters one token passes through: all but the experts it is not routed to."""
        unused = self.expert_parameters * (self.experts - self.top_k) // self.experts if self.experts else 0
        return self.parameters - self.vision_parameters - unused


def tiny_config(family: str, size: str = "tiny"):
    """The config of the tiny model `build_tiny_model(family, size=size)` writes (token ids aside)."""
    return TINY_CONFIGS[family](SIZES[size], {t: i for i, t in enumerate(SPECIAL_TOKENS)})


def known_name(value: str) -> str | None:
    """The built-in table's key for a hub id or a folder path ending in that name, else None."""
    name = Path(value.rstrip("/")).name
    return name if name in KNOWN_CONFIGS else None


def load_config_dict(value: str):
    """(transformers config, source) of `value` (module docstring); ValueError when none fits."""
    from transformers import AutoConfig

    if value.startswith(TINY_PREFIX):
        family, _, size = value[len(TINY_PREFIX):].partition(":")
        if family not in TINY_CONFIGS or (size or "tiny") not in SIZES:
            raise ValueError(f"{value}: give tiny:FAMILY[:SIZE], FAMILY one of {', '.join(TINY_CONFIGS)}, "
                             f"SIZE one of {', '.join(SIZES)}")
        return tiny_config(family, size or "tiny"), f"the tiny {family} model ({size or 'tiny'}) the demo builds"
    path = Path(value).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not a JSON config ({e})") from None
        source = f"config.json at {path}"
    elif known_name(value):
        data, source = KNOWN_CONFIGS[known_name(value)], f"built-in table: {known_name(value)} (official config.json)"
    else:
        raise ValueError(f"{value}: no config.json there and not in the built-in table "
                         f"({', '.join(KNOWN_CONFIGS)}); give --model-config PATH (a model folder or config.json)")
    data = dict(data)
    model_type = data.pop("model_type", None)
    if model_type not in {f.model_type for f in MODEL_FAMILIES.values()}:
        raise ValueError(f"{value}: model_type {model_type!r} is not a supported family "
                         f"({', '.join(f.model_type for f in MODEL_FAMILIES.values())})")
    return AutoConfig.for_model(model_type, **data), source


def read_shape(value: str) -> ModelShape:
    """The `ModelShape` of `value` (a folder, a config.json, a built-in name or tiny:FAMILY)."""
    from transformers import AutoModelForImageTextToText

    config, source = load_config_dict(value)
    with torch.device("meta"):  # no memory: shapes only
        model = AutoModelForImageTextToText.from_config(config)
    text, vision = config.get_text_config(), config.vision_config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    inner = model.model
    layers = list(inner.language_model.layers)
    blocks = list(inner.visual.blocks)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    vocab, hidden = model.lm_head.weight.shape
    units = [(count(b), _experts(b)) for b in layers + blocks] + [(vocab * hidden, 0)]
    linears = tuple((name, m.in_features, m.out_features) for name, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear))
    return ModelShape(
        source=source, model_type=config.model_type, hidden=text.hidden_size, layers=len(layers), heads=heads,
        kv_heads=text.num_key_value_heads, head_dim=head_dim, vocab=vocab,
        qk_norm=any(hasattr(getattr(x, "self_attn", None), "q_norm") for x in layers),
        vision_hidden=getattr(vision, "embed_dim", None) or vision.hidden_size, vision_layers=len(blocks),
        vision_heads=vision.num_heads,
        vision_intermediate=_vision_intermediate(blocks[0]), vision_gated=hasattr(blocks[0].mlp, "gate_proj"),
        merge=vision.spatial_merge_size,
        patch_values=3 * vision.temporal_patch_size * vision.patch_size**2,
        parameters=count(model) + (vocab * hidden if model.lm_head.weight is inner.language_model.embed_tokens.weight
                                   else 0),
        vision_parameters=count(inner.visual), largest_unit=max(units)[0], unit_experts=max(units)[1],
        root_unit=count(model) - sum(count(b) for b in layers + blocks)
        - (0 if model.lm_head.weight is inner.language_model.embed_tokens.weight else vocab * hidden),
        lora_candidates=linears, **_mlp_widths(layers, getattr(text, "num_experts_per_tok", 0)))


def _experts(layer) -> int:
    """Parameters of a layer's routed experts (0: a dense layer or a vision block)."""
    experts = getattr(getattr(layer, "mlp", None), "experts", None)
    return sum(p.numel() for p in experts.parameters()) if experts is not None else 0


def _mlp_widths(layers, top_k: int) -> dict:
    """`ModelShape`'s MLP fields: the widest MLP a token passes through and, for MoE models, the
    experts' shape read from the first sparse layer's tensors (gate_up_proj [E, 2I, H])."""
    sparse = [x.mlp for x in layers if hasattr(x.mlp, "experts")]
    dense = [x.mlp.gate_proj.out_features for x in layers if not hasattr(x.mlp, "experts")]
    if not sparse:
        return dict(intermediate=max(dense))
    experts, two_i = sparse[0].experts.gate_up_proj.shape[:2]
    shared = getattr(sparse[0], "shared_expert", None)
    shared_width = shared.gate_proj.out_features if shared is not None else 0
    return dict(intermediate=max(dense + [top_k * two_i // 2 + shared_width]), experts=experts, top_k=top_k,
                expert_intermediate=two_i // 2, shared_intermediate=shared_width, sparse_layers=len(sparse),
                expert_parameters=sum(_experts(x) for x in layers))


def _vision_intermediate(block) -> int:
    """The vision MLP's intermediate width, whatever its layers are called."""
    first = getattr(block.mlp, "gate_proj", None) or getattr(block.mlp, "fc1", None) or getattr(block.mlp, "linear_fc1")
    return first.out_features
