"""The bad-input corpus (tests/bad_corpus.py) through check-data, cache, train (2 steps), eval
and score, each a real subprocess: every bad record gets an error naming it (its problem_id,
or `record 5` for the line that is not JSON) and saying what to do, every valid record is
processed, and no command crashes (no traceback; exit status 0, or 1 where the command's
contract says "some records failed").

OUTCOMES is the table of classes and what each command makes of them: `ok` (processed like
any valid record) or `error` (reported, the command goes on with the others). `score` reads
no media, so broken media score fine there; `cache` reads only media, so an unknown
problem_type is cached.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from bad_corpus import MALFORMED, write_corpus

from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from chaos import EVAL_CODE  # noqa: E402  (the same evaluator run as the chaos benchmark)

TIMEOUT_S = 1200  # ends a hang
COMMANDS = ("check-data", "cache", "train", "eval", "score")
OK, ERR = "ok", "error"
MEDIA_BROKEN = (ERR, ERR, ERR, ERR, OK)
BAD_RECORD = (ERR, ERR, ERR, ERR, ERR)
OUTCOMES = {  # class -> outcome per command, in COMMANDS order
    "valid-video": (OK,) * 5, "valid-image": (OK,) * 5, "valid-text": (OK,) * 5,
    "vfr-video": (OK,) * 5, "rotated-video": (OK,) * 5, "one-frame-video": (OK,) * 5,
    "hour-long-video": (OK,) * 5, "grayscale-image": (OK,) * 5, "cmyk-image": (OK,) * 5,
    "16bit-image": (OK,) * 5, "long-offline-trajectory": (OK,) * 5,
    "truncated-video": MEDIA_BROKEN, "zero-byte-video": MEDIA_BROKEN, "non-video": MEDIA_BROKEN,
    "audio-only-video": MEDIA_BROKEN, "missing-media": MEDIA_BROKEN,
    "unknown-problem-type": (ERR, OK, ERR, ERR, ERR),
    "wrong-field-types": BAD_RECORD, "too-many-placeholders": BAD_RECORD, MALFORMED: BAD_RECORD,
}
VISION = {"family": "qwen2_5_vl", "max_frames": 4, "video_min_pixels": 3136, "video_max_pixels": 3136,
          "image_min_pixels": 3136, "image_max_pixels": 3136}


def _mentions(text: str, name: str) -> bool:
    return (f"problem_id={name}" in text or repr(name) in text or f"sample {name} " in text
            or (name == MALFORMED and "record 5: line 6 is not valid JSON" in text))


def _run(args, cwd, ok_codes=(0,)):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = forkserver.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    text = proc.stdout + proc.stderr
    assert proc.returncode in ok_codes and "Traceback" not in text, f"{args[:5]} exited {proc.returncode}:\n{text[-4000:]}"
    return text


def _cli(*args):
    return [sys.executable, "-m", "easyvideor1.cli", *args]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    data, cases = write_corpus(root)
    assert {c.name for c in cases} == set(OUTCOMES)
    return root, data


def _expect(command):
    col = COMMANDS.index(command)
    return ({n for n, o in OUTCOMES.items() if o[col] == OK}, {n for n, o in OUTCOMES.items() if o[col] == ERR})


def test_check_data_and_cache(corpus):
    root, data = corpus
    ok, bad = _expect("check-data")
    text = _run(_cli("check-data", str(data)), root, ok_codes=(1,))
    assert all(_mentions(text, n) for n in bad), text
    assert not any(_mentions(text, n) for n in ok), text
    assert f"{len(OUTCOMES)} records checked: {len(bad)} bad record(s)" in text

    ok, bad = _expect("cache")
    _run(_cli("cache", "--data", str(data), "--out", str(root / "cache"), "--workers", "0", "--no-progress",
              "--video-max-frames", "4", "--video-max-pixels", "3136", "--video-min-pixels", "784"), root,
         ok_codes=(1,))
    manifest = [json.loads(line)["problem_id"] for line in (root / "cache" / "manifest.jsonl").read_text().splitlines()]
    failures = [json.loads(line) for line in (root / "cache" / "failures.jsonl").read_text().splitlines()]
    assert sorted(manifest) == sorted(ok)
    named = {f["problem_id"] or ("malformed-jsonl" if "line 6" in f["detail"] else "?") for f in failures}
    assert named == bad and all(f["detail"] for f in failures)


def test_train_two_steps(corpus):
    root, data = corpus
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    cfg = {"vision": VISION, "model": {"path": str(model), "dtype": "float32"},
           "rollout": {"engine": "hf", "n": 2, "max_tokens": 8, "temperature": 1.0},
           "algorithm": {"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean",
                         "disable_kl": True},
           # 17 records load; 12 per step in file order: step 1 holds all 11 valid ones, and the
           # two steps meet each of the 6 whose prompt fails exactly once.
           "training": {"steps": 2, "rollout_batch_size": 12, "mini_batch_size": 12, "micro_batch_size": 4,
                        "lr": 1e-3, "seed": 0},
           "hybrid": {"enable": True},
           "data": {"train_files": [str(data)], "shuffle": False, "on_error": "skip",
                    "max_skip_fraction": 1.0},  # 6 of 24 skipped: counted, the run goes on
           "logging": {"out_dir": str(root / "train"), "progress": False},
           "checkpoint": {"every": 0, "resume": "never"}}
    (root / "train.yaml").write_text(yaml.safe_dump(cfg))
    text = _run(_cli("train", str(root / "train.yaml")), root)
    ok, bad = _expect("train")
    warnings = "\n".join(line for line in text.splitlines() if line.startswith("WARNING") or line.startswith("  record"))
    assert all(_mentions(warnings, n) for n in bad), warnings
    skipped = [line for line in warnings.splitlines() if "skipped" in line or "bad record" in line]
    assert not any(_mentions(line, n) for line in skipped for n in ok), skipped
    assert "long-offline-trajectory has" in warnings and "truncated" in warnings  # said, not an error
    rows = [json.loads(line) for line in (root / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert sum(r["data/prompt_failures"] for r in rows) == 6


def test_eval_and_score(corpus):
    root, data = corpus
    model = root / "model" if (root / "model").exists() else build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    _run([sys.executable, "-c", EVAL_CODE, str(model), str(data), str(root / "eval")], root)
    rows = {r["id"]: r for r in map(json.loads, (root / "eval" / "file-data.jsonl").read_text().splitlines())}
    ok, bad = _expect("eval")
    assert len(rows) == len(OUTCOMES)  # every record has a row: none dropped, none doubled
    assert {i for i, r in rows.items() if r["status"] == "ok"} == ok
    failed = {("malformed-jsonl" if i == "record-5" else i): r["reason"] for i, r in rows.items() if r["status"] == "failed"}
    assert set(failed) == bad and all(failed.values())

    responses = root / "responses.jsonl"
    responses.write_text("".join(json.dumps({"problem_id": n, "response": "<think>.</think><answer>A</answer>"}) + "\n"
                                 for n in OUTCOMES))
    text = _run(_cli("score", "--data", str(data), "--responses", str(responses), "--workers", "0"), root,
                ok_codes=(1,))
    scored = [json.loads(line) for line in (root / "responses.scores.jsonl").read_text().splitlines()]
    ok, bad = _expect("score")
    assert {r["problem_id"] for r in scored if r.get("error") is None} == ok
    errors = {("malformed-jsonl" if r["problem_id"] == "record-5" else r["problem_id"]) for r in scored if r.get("error")}
    assert errors == bad and all(_mentions(text, n) for n in bad)
