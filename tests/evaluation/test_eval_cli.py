"""`cache` then `eval --cache-dir` as a new user runs them: a cache built with other parameters
is one paragraph on stderr (no traceback) naming the differing fields, then the eval flags that
read the cache as it is, then a `cache` command; each, run as given, makes an eval that reads
every frame from a cache (cache_only); the frame and length options land in settings.json."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from easyvideor1 import cli
from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalcli")
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    data = write_suite(root / "data", num_train=0, num_val=3, seed=2)["val"]
    return root, model, data


FRAME_OPTIONS = ["--max-new-tokens", "6", "--fps", "1", "--max-frames", "4", "--video-max-pixels", "12544",
                 "--image-max-pixels", "12544"]


def _eval(model, data, out, cache, *extra):
    return cli.main(["eval", "--model", str(model), "--benchmarks", str(data), "--engine", "hf", "--dtype", "float32",
                     "--out", str(out), "--cache-dir", str(cache), "--load-workers", "1", *FRAME_OPTIONS, *extra])


def test_cache_mismatch_is_one_paragraph_with_a_command_that_fixes_it(setup, tmp_path, capsys):
    root, model, data = setup
    cache = tmp_path / "cache"
    assert cli.main(["cache", "--data", str(data), "--out", str(cache), "--workers", "0", "--no-progress",
                     "--video-max-pixels", "12544", "--video-min-pixels", "3136", "--image-max-pixels", "12544",
                     "--image-min-pixels", "3136"]) == 0
    capsys.readouterr()

    assert _eval(model, data, tmp_path / "out", cache) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"easyvideor1 eval: frame cache {cache} was built with other vision parameters")
    for field in ("fps: cache has 2.0, config has 1.0", "max_frames: cache has 128, config has 4",
                  "video_total_pixels: cache has 19267584, config has 90316800"):
        assert field in err
    assert "video_max_pixels: cache" not in err  # equal fields are not listed

    # First proposed: the eval flags (`cache`'s names) that read this cache as it is.
    flags = shlex.split(re.search(r"give eval its settings: `([^`]+)`", err).group(1))
    assert flags[:2] == ["--fps", "2"] and "--video-total-pixels" in flags and "--video-min-pixels" in flags
    as_cached = tmp_path / "as-cached"
    assert cli.main(["eval", "--model", str(model), "--benchmarks", str(data), "--dtype", "float32", "--out",
                     str(as_cached), "--cache-dir", str(cache), "--cache-mode", "cache_only", "--load-workers", "1",
                     "--max-new-tokens", "6", *flags]) == 0
    assert "engine: hf (auto: no GPU here" in capsys.readouterr().out
    assert len((as_cached / "file-val.jsonl").read_text().splitlines()) == 3

    command = shlex.split(re.search(r"`(easyvideor1 cache [^`]+)`", err).group(1))
    fresh = command[command.index("--out") + 1]
    argv = [str(data) if a == "FILE" else a for a in command[1:]] + ["--workers", "0", "--no-progress"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    assert _eval(model, data, out, fresh, "--cache-mode", "cache_only") == 0  # every frame from the cache
    settings = json.loads((out / "settings.json").read_text())
    flat = settings.get("settings", settings)
    assert (flat["sampling.max_new_tokens"], flat["vision.fps"], flat["vision.max_frames"]) == (6, 1.0, 4)
    assert (flat["vision.video_max_pixels"], flat["vision.image_max_pixels"]) == (12544, 12544)
    rows = [json.loads(line) for line in (out / "file-val.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["status"] == "ok" and 1 <= r["output_tokens"] <= 6 for r in rows)


def test_cache_preset_is_the_eval_presets_budget():
    from easyvideor1.evaluation.presets import EVAL_PRESETS
    from easyvideor1.vision.commands import config_from_args

    parser = cli.build_parser()
    for name, preset in EVAL_PRESETS.items():
        args = parser.parse_args(["cache", "--preset", name, "--data", "d.jsonl", "--out", "c"])
        assert config_from_args(args).key_params() == preset.vision.key_params(), name
    args = parser.parse_args(["cache", "--preset", "qwen3_vl", "--data", "d", "--out", "c", "--fps", "1",
                              "--family", "qwen3_5"])
    got = config_from_args(args)
    assert (got.fps, got.family, got.max_frames) == (1.0, "qwen3_5", 768)
    with pytest.raises(SystemExit):  # unknown names are refused by argparse, which lists the choices
        parser.parse_args(["cache", "--preset", "qwen4", "--data", "d", "--out", "c"])
