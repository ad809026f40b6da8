"""The config tree: YAML + dotted overrides, validation at load, documented fields."""

import dataclasses
import typing

import pytest

from easyvideor1 import config_tree
from easyvideor1.config import Config, load_config
from easyvideor1.config_tree import ConfigError


def test_yaml_plus_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  steps: 7\n  lr: 1e-5\nrollout:\n  n: 4\nvision:\n  fps: 1\n")
    cfg = load_config(str(path), ["training.steps=9", "rollout.engine=vllm", "data.train_files=[a.jsonl,b.jsonl]"])
    assert cfg.training.steps == 9 and cfg.training.lr == 1e-5 and cfg.rollout.n == 4
    assert cfg.vision.fps == 1.0 and isinstance(cfg.vision.fps, float)
    assert cfg.rollout.engine == "vllm" and cfg.data.train_files == ["a.jsonl", "b.jsonl"]


@pytest.mark.parametrize("override, message", [
    (["training.stepz=3"], "did you mean 'steps'"),
    (["trainng.steps=3"], "valid keys here: data, vision"),
    (["rollout.engine=sglang"], "'hf', 'vllm'"),
    (["training.steps=many"], "training.steps: expected int"),
    (["training.steps=2.5"], "expected an integer"),
    (["algorithm.adv_estimator=ppo"], "valid: grpo"),
    (["algorithm.policy_loss=nope"], "ppo_clip"),
    (["vision.family=qwen9"], "qwen2_vl"),
    (["algorithm.preset=nope"], "valid: grpo"),
    (["training.rollout_batch_size=10", "training.mini_batch_size=4"], "multiple of"),
    (["hybrid.enable=true", "rollout.n=1"], "rollout.n >= 2"),
    (["training.micro_batch_tokens=-1"], "micro_batch_tokens must be >= 0"),
])
def test_bad_values_fail_at_load_listing_valid_ones(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, override)


def test_presets_fill_the_algorithm_and_explicit_fields_win():
    cfg = load_config(None, ["algorithm.preset=dapo", "algorithm.clip_ratio_high=0.3"])
    assert cfg.algorithm.online_filtering and cfg.algorithm.disable_kl
    assert cfg.algorithm.clip_ratio_high == 0.3 and cfg.algorithm.clip_ratio_low == 0.2


def _sections(cls):
    yield cls
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _sections(tp)


def test_every_field_has_a_one_line_docstring():
    for cls in _sections(Config):
        docs = config_tree.field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"
            assert "\n" not in docs[f.name], f"{cls.__name__}.{f.name}: docstring is not one line"
    lines = config_tree.describe(Config)
    assert any(l.startswith("training.lr = ") for l in lines)


def test_shipped_configs_load():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert len(configs) >= 3
    for path in configs:
        cfg = load_config(str(path))
        assert cfg.rollout.n >= 2, path
    paper = load_config(str(Path(__file__).resolve().parents[1] / "configs" / "qwen2_5_vl_7b_8gpu.yaml"))
    assert (paper.algorithm.clip_ratio_low, paper.algorithm.clip_ratio_high) == (0.2, 0.28)
    assert paper.algorithm.disable_kl and paper.rollout.n == 8 and paper.training.lr == 1e-6
    assert (paper.vision.fps, paper.vision.max_frames, paper.vision.video_max_pixels) == (2.0, 128, 262144)
    assert paper.vision.image_max_pixels == 1048576 and paper.rollout.max_tokens == 4096
    for path in (p for p in configs if p.stem.endswith("_8gpu")):  # start without flash-attn, keep packing on
        gpu = load_config(str(path))
        assert gpu.model.attn_implementation == "sdpa" and gpu.training.padding_free and gpu.training.shared_prefix


def test_explicit_fields_win_over_a_preset_and_are_named(tmp_path, caplog):
    path = tmp_path / "c.yaml"
    path.write_text("algorithm:\n  adv_estimator: grpo\n  loss_agg_mode: token_mean\n")
    with caplog.at_level("WARNING", logger="easyvideor1.config"):
        cfg = load_config(str(path), ["algorithm.preset=remax", "algorithm.kl_coef=0.02"])
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.kl_coef == 0.02
    assert cfg.algorithm.kl_estimator == "k1"  # the preset's, not overridden
    [line] = [r.getMessage() for r in caplog.records]
    assert line == ("algorithm.preset=remax: adv_estimator=grpo (from the config file) overrides the preset's "
                    "remax; kl_coef=0.02 (from the command line) overrides the preset's 0.01")
    caplog.clear()
    load_config(None, ["algorithm.preset=dapo", "algorithm.clip_ratio_high=0.28"])  # equal to the preset's
    assert not caplog.records
