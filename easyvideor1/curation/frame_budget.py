"""The frame budget of a curation run: an evaluation preset's, re-targeted to the model's
family, with `--vision field=value` overrides. Torch-free, so the command checks it before any
model loads."""

from __future__ import annotations

import dataclasses
from typing import Any

from easyvideor1.errors import UserError
from easyvideor1.evaluation.presets import get_preset
from easyvideor1.vision.config import VisionConfig


def vision_config(preset: str, family: str | None, overrides: tuple[str, ...]) -> VisionConfig:
    """The preset's frame budget, for `family`, with `field=value` overrides (typed by the field)."""
    try:
        base = get_preset(preset).vision
    except ValueError as e:
        raise UserError(f"--preset: {e}") from None
    types = {f.name: f.type for f in dataclasses.fields(VisionConfig)}
    changes: dict[str, Any] = {"family": family} if family else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in types:
            raise UserError(f"--vision {item!r}: expected field=value with a field of VisionConfig "
                            f"({', '.join(types)})")
        cast = {"int": int, "float": float}.get(str(types[key]), str)
        try:
            changes[key] = cast(value)
        except ValueError:
            raise UserError(f"--vision {item!r}: {key} takes a {cast.__name__}") from None
    try:
        return dataclasses.replace(base, **changes)
    except ValueError as e:
        raise UserError(f"--vision: {e}") from None
