"""What the actor update processes and its model FLOPs, attention included.

MFU of the actor update = update FLOPs / update_s / peak. Update FLOPs = 6 x (params x tokens
each runs on) + attention's sequence-length term, counting
  * LLM decoder layers + final norm (embedding lookups are not FLOPs) x LLM tokens in the update,
  * lm_head (vocab x hidden) x response tokens only (log-probs are made for those alone),
  * vision blocks + patch embedding x vision patches, merger(s) x patches / merge,
  * attention (`attention_flops`): 12 x layers x (heads x head_dim) x attended (query, key) pairs:
    QK^T and AV are 2 x 2 FLOPs per pair and head dimension forward, twice that backward. Pairs
    are counted as the kernels see them: causal pieces n(n+1)/2, a response of r tokens after a
    shared prompt of P: r x P + r(r+1)/2; vision windows w^2 per window and layer (`vision_pairs`).
Gradient checkpointing recomputes the forward (hardware FLOPs ~ 8ND); MFU counts 6ND, as is the
convention.
"""

from __future__ import annotations

from dataclasses import dataclass


def causal_pairs(n: int) -> int:
    """Attended (query, key) pairs of causal attention over n tokens."""
    return n * (n + 1) // 2


def piece_pairs(parts: tuple[int, ...]) -> int:
    """Pairs of one packed block: (n,) plain causal, or (prompt, response 1, ...) group-shared."""
    prompt, responses = parts[0], parts[1:]
    return causal_pairs(prompt) + sum(r * prompt + causal_pairs(r) for r in responses)


def _window_sides(side: int, window: int) -> list[int]:
    return [min(window, side - s) for s in range(0, side, window)]


def vision_pairs(grid: tuple[int, int, int], window: int, merge: int) -> tuple[int, int]:
    """(full-attention pairs, window-attention pairs) of one image/video of `grid` = (t, h, w)
    patches per vision layer: full attention is per temporal patch ((h w)^2 each); windows are
    `window` x `window` merged tokens (Qwen2.5-VL; 0: no windows), cut at the frame's edges."""
    t, h, w = grid
    full = t * (h * w) ** 2
    if not window:
        return full, 0
    rows = sum((merge * a) ** 2 for a in _window_sides(h // merge, window))
    cols = sum((merge * b) ** 2 for b in _window_sides(w // merge, window))
    return full, t * rows * cols


def attention_flops(layers: int, width: int, pairs: int) -> float:
    """Forward + backward FLOPs of attention's QK^T and AV: 12 x layers x width x pairs
    (width = heads x head_dim of the queries; GQA shares keys, not query FLOPs)."""
    return 12.0 * layers * width * pairs


@dataclass
class UpdateCounter:
    """What the actor update's forward passes process, read by a pre-hook on the backbone
    (`model.model`) when gradients are on: rollout and log-prob passes run without gradients,
    and gradient checkpointing recomputes blocks inside it, never the backbone's own call."""

    window: int = 0  # vision window side in merged tokens (0: none)
    merge: int = 2
    llm_tokens: int = 0
    llm_pairs: int = 0
    vision_patches: int = 0
    vision_full_pairs: int = 0
    vision_window_pairs: int = 0
    images: int = 0
    videos: int = 0
    sequences: int = 0

    def reset(self) -> None:
        for k in ("llm_tokens", "llm_pairs", "vision_patches", "vision_full_pairs", "vision_window_pairs", "images",
                  "videos", "sequences"):
            setattr(self, k, 0)

    def hook(self, module, args, kwargs):
        import torch

        if not torch.is_grad_enabled():
            return
        mask, ids, packing = kwargs.get("attention_mask"), kwargs.get("input_ids"), kwargs.get("packing")
        if hasattr(packing, "rows"):  # right-padded group-shared rows: each row's first block is its group
            self.llm_tokens += sum(row.blocks[0][1] for row in packing.rows)
            self.llm_pairs += sum(piece_pairs(row.parts[0]) for row in packing.rows)
            self.sequences += len(packing.rows)
        elif packing is not None:  # a padding-free row: its blocks of one are the masked dummy vision tokens
            real = [(e - s, parts) for (s, e), parts in zip(packing.blocks, packing.parts) if e - s > 1]
            self.llm_tokens += sum(n for n, _ in real)
            self.llm_pairs += sum(piece_pairs(parts) for _, parts in real)
            self.sequences += len(real)
        else:
            lengths = mask.sum(-1).tolist() if mask is not None else [ids.shape[-1]] * ids.shape[0]
            self.llm_tokens += int(sum(lengths))
            self.llm_pairs += sum(causal_pairs(int(n)) for n in lengths)
            self.sequences += len(lengths)
        for key, attr in (("image_grid_thw", "images"), ("video_grid_thw", "videos")):
            grid = kwargs.get(key)
            if grid is not None:
                self.vision_patches += int(grid.prod(-1).sum())
                for g in grid.tolist():
                    full, windowed = vision_pairs(tuple(g), self.window, self.merge)
                    self.vision_full_pairs += full
                    self.vision_window_pairs += windowed
                # collate's masked 1-token dummies have a 1 x 2 x 2 grid; real items are larger
                setattr(self, attr, getattr(self, attr) + int((grid.prod(-1) > 4).sum()))


def flop_params(model) -> dict[str, int]:
    """Trainable parameter counts by what they run on (see the module docstring)."""
    from easyvideor1.models.loading import vision_tower

    def count(module, skip=lambda name: False):
        return sum(p.numel() for n, p in module.named_parameters() if p.requires_grad and not skip(n))

    lm = model.model.language_model
    visual = vision_tower(model)
    return dict(
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        llm_body=count(lm, skip=lambda n: "embed_tokens" in n),
        lm_head=int(model.lm_head.weight.shape[0] * model.lm_head.weight.shape[1]),
        vision_per_patch=count(visual, skip=lambda n: "merger" in n or "pos_embed" in n),
        vision_per_merged=count(visual, skip=lambda n: "merger" not in n),
        merge=int(visual.spatial_merge_size) ** 2 if hasattr(visual, "spatial_merge_size") else 4,
        **attention_dims(model.config),
    )


def attention_dims(config) -> dict[str, int]:
    """Layers and query widths of the attention FLOPs (`attention_flops`), from an HF config."""
    text, vision = config.get_text_config(), config.vision_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    depth = getattr(vision, "depth", 0)
    full = getattr(vision, "fullatt_block_indexes", None)
    full_layers = depth if full is None else len(full)  # Qwen2.5-VL: the others attend in windows
    return dict(llm_layers=text.num_hidden_layers, llm_width=text.num_attention_heads * head_dim,
                vision_width=getattr(vision, "embed_dim", None) or vision.hidden_size,
                vision_full_layers=full_layers, vision_window_layers=depth - full_layers)


def vision_window(config) -> int:
    """Qwen2.5-VL's window side in merged tokens (0: no window attention)."""
    v = config.vision_config
    size = getattr(v, "window_size", 0)
    return size // v.patch_size // v.spatial_merge_size if size and getattr(v, "fullatt_block_indexes", None) else 0


def update_flops(p: dict[str, int], c: UpdateCounter, response_tokens: float) -> float:
    """The 6ND part (parameters x tokens) of the update's FLOPs."""
    return 6.0 * (p["llm_body"] * c.llm_tokens + p["lm_head"] * response_tokens
                  + p["vision_per_patch"] * c.vision_patches + p["vision_per_merged"] * c.vision_patches / p["merge"])




def update_attention_flops(p: dict[str, int], c: UpdateCounter) -> float:
    """The attention part of the update's FLOPs: the LLM's and the vision tower's."""
    return (attention_flops(p["llm_layers"], p["llm_width"], c.llm_pairs)
            + attention_flops(p["vision_full_layers"], p["vision_width"], c.vision_full_pairs)
            + attention_flops(p["vision_window_layers"], p["vision_width"], c.vision_window_pairs))
