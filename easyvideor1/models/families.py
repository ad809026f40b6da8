"""What differs between the Qwen-VL model families, declared in one place.

Every family-specific number or rule the rest of the package needs is a field here, so a
new family is one entry in `FAMILIES`, not a hunt for `if "qwen3" in name` branches.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    patch_size: int  # vision patch side, pixels
    merge_size: int  # spatial merge of patches into one token
    temporal_patch_size: int  # frames folded into one temporal token
    video_budget_is_total: bool  # video max pixels count over all frames (Qwen3-VL) or per frame
    model_type: str  # config.model_type in transformers

    @property
    def grid_factor(self) -> int:
        """Frame sides must be multiples of this (28 for Qwen2/2.5-VL, 32 for Qwen3-VL/3.5)."""
        return self.patch_size * self.merge_size


FAMILIES: dict[str, Family] = {
    "qwen2_vl": Family("qwen2_vl", 14, 2, 2, False, "qwen2_vl"),
    "qwen2_5_vl": Family("qwen2_5_vl", 14, 2, 2, False, "qwen2_5_vl"),
    "qwen3_vl": Family("qwen3_vl", 16, 2, 2, True, "qwen3_vl"),
    "qwen3_5": Family("qwen3_5", 16, 2, 2, True, "qwen3_5"),
}


def get_family(name: str) -> Family:
    """The family called `name`; an unknown name is an error listing the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None
