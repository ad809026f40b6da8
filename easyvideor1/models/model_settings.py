"""What a trained model folder carries so that evaluation sees what training saw.

`train`, `demo` and `export` write `MODEL/easyvideor1.json` beside the HF files: the frame
budget (`vision`), the prompt template (copied into `MODEL/prompt_templates/`, so the folder
moves in one piece), the compute dtype, the response length and the model family, plus where
they came from. `easyvideor1 eval --model MODEL` starts from them (flags override), and
`eval --settings-from SRC` takes them from another model, a training config or a run.

A template copied under its own name keeps its digest (`evaluation.settings.template_digest`
hashes names relative to the template's folder), so a model evaluated with its copy and
another evaluated with the original file are scored under one protocol.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from easyvideor1.errors import UserError
from easyvideor1.vision.config import VisionConfig

MODEL_SETTINGS_FILE = "easyvideor1.json"
TEMPLATES = "prompt_templates"  # the copied prompt template(s), inside the model folder
# The VisionConfig fields that decide the pixels a model sees (the decoder choice does not).
VISION_KEYS = ("fps", "min_frames", "max_frames", "video_min_pixels", "video_max_pixels", "video_total_pixels",
               "image_min_pixels", "image_max_pixels")


@dataclass
class ModelSettings:
    """The settings a model was trained with, as evaluation needs them."""

    family: str
    """Model family (`models.families`)."""
    dtype: str
    """Compute dtype of training (and of the exported weights)."""
    vision: dict[str, Any]
    """Frame sampling and pixel budgets, `VISION_KEYS`."""
    template: str | None = None
    """Prompt template file or folder (None: the package's built-in templates)."""
    max_new_tokens: int | None = None
    """Response length limit of training's rollouts, tokens."""
    source: dict[str, Any] = field(default_factory=dict)
    """Where they came from: the command that wrote them, the checkpoint and its step, the config."""

    def vision_config(self) -> VisionConfig:
        return VisionConfig(family=self.family, **{k: self.vision[k] for k in VISION_KEYS})


def settings_of(cfg, **source: Any) -> ModelSettings:
    """The settings of a training `Config`."""
    v = cfg.vision
    return ModelSettings(family=v.family, dtype=cfg.model.dtype, vision={k: getattr(v, k) for k in VISION_KEYS},
                         template=cfg.data.template_dir, max_new_tokens=cfg.rollout.max_tokens,
                         source={k: val for k, val in source.items() if val is not None})


def write(model_dir: str | os.PathLike, settings: ModelSettings) -> Path:
    """Write `settings` into `model_dir`, copying the template beside them; returns the file."""
    model_dir = Path(model_dir)
    data = dataclasses.asdict(settings)
    if settings.template:
        src = Path(settings.template)
        dst = model_dir / TEMPLATES
        shutil.rmtree(dst, ignore_errors=True)
        if src.is_file():
            dst.mkdir(parents=True)
            shutil.copy2(src, dst / src.name)
            data["template"] = f"{TEMPLATES}/{src.name}"
        else:
            shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if not n.endswith(".jinja")
                                                              and not (Path(d) / n).is_dir()])
            data["template"] = TEMPLATES
        data["source"] = {**data["source"], "template": str(src)}
    path = model_dir / MODEL_SETTINGS_FILE
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path


def read(model_dir: str | os.PathLike) -> ModelSettings | None:
    """The settings `model_dir` carries (its template as a path under it), or None without them."""
    path = Path(model_dir) / MODEL_SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        s = ModelSettings(**data)
        s.vision_config()  # every key present, values valid
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(f"{path}: not the settings file `easyvideor1 train/export` writes ({e}); delete it to "
                        "evaluate at the preset's settings, or export the model again") from None
    if s.template:
        s.template = str(Path(model_dir) / s.template)
    return s
