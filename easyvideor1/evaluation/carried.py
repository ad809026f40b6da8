"""Where an `eval` run's settings start: a preset, or the settings a trained model carries.

Order, later wins: the preset (`--preset`, default `qwen2_5_vl_greedy`); then the settings a
trained model carries (`models.model_settings`: frame budget, prompt template, dtype, response
length), from `--settings-from SRC` or else from the model itself unless `--preset` is given;
then each flag. `Start.sources` says which of them set each value, and `settings.json` keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from easyvideor1.config import load_config
from easyvideor1.errors import UserError
from easyvideor1.evaluation.presets import DEFAULT_DTYPE, DEFAULT_PRESET, SOURCE_HELP, Overrides
from easyvideor1.models import model_settings
from easyvideor1.models.model_settings import ModelSettings
from easyvideor1.training.state.checkpoint import named_by, recorded_config


@dataclass
class Start:
    """The settings an eval run uses besides the preset, and where each came from."""

    preset: str
    overrides: Overrides
    template: str | None
    dtype: str
    sources: dict[str, Any] = field(default_factory=dict)
    """{"preset": name, "carried": file or config or None, "flags": {flag: value}}."""

    def line(self) -> str:
        """The one line `eval` prints about it."""
        flags = " ".join(f"{k} {v}" for k, v in self.sources["flags"].items())
        if self.sources["carried"]:
            return (f"settings from {self.sources['carried']} (frames, prompt template, dtype, response length)"
                    f"{'; flags override: ' + flags if flags else '; flags override'}")
        unused = self.sources.get("not_used")
        return (f"settings of preset {self.preset}" + (f" (not the model's own in {unused}: --preset given)"
                                                        if unused else "")
                + (f"; flags override: {flags}" if flags else ""))


def load_source(src: str, flag: str = "--settings-from") -> tuple[ModelSettings, str]:
    """(the settings `src` carries or its training config gives, what it is: a file or a checkpoint)."""
    path = Path(src).expanduser()
    if path.is_file() and path.suffix.lower() in (".yaml", ".yml"):
        # the settings only: a training config written before the prompt budget check still reads
        return model_settings.settings_of(load_config(str(path), check_prompt=False), config=str(path)), str(path)
    if path.is_dir():
        for folder in (path, path / "hf_model", path / "train" / "hf_model"):
            found = model_settings.read(folder)
            if found is not None:
                return found, str(folder / model_settings.MODEL_SETTINGS_FILE)
        checkpoint = named_by(path)
        if checkpoint is not None:
            try:
                cfg = recorded_config(checkpoint)
            except FileNotFoundError as e:
                raise UserError(f"{flag} {src}: {e}; give the run's YAML config instead") from None
            return model_settings.settings_of(cfg, checkpoint=str(checkpoint)), f"the config of {checkpoint}"
    raise UserError(f"{flag} {src}: carries no settings; give {SOURCE_HELP}")


def start(model: str, preset: str | None, settings_from: str | None, flags: Overrides, template: str | None,
          dtype: str | None) -> Start:
    """The run's preset, overrides, template and dtype (module docstring: the order)."""
    carried, origin, unused = None, None, None
    own = Path(model) / model_settings.MODEL_SETTINGS_FILE
    if settings_from:
        carried, origin = load_source(settings_from)
    elif preset is None:
        carried = model_settings.read(model)
        origin = str(own) if carried else None
    elif own.is_file():
        unused = str(own)
    overrides = flags
    if carried is not None:
        overrides = flags.over(Overrides(max_new_tokens=carried.max_new_tokens, **carried.vision))
    given = {**flags.flags(), **({"--template-dir": template} if template else {}),
             **({"--dtype": dtype} if dtype else {})}
    return Start(preset=preset or DEFAULT_PRESET, overrides=overrides,
                 template=template or (carried.template if carried else None),
                 dtype=dtype or (carried.dtype if carried else DEFAULT_DTYPE),
                 sources={"preset": preset or DEFAULT_PRESET, "carried": origin, "flags": given,
                          **({"not_used": unused} if unused else {})})
