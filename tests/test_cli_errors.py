"""Every subcommand answers a wrong argument in one line, before any model or engine starts.

Each case runs the real command line (`cli.main`, as the `easyvideor1` script does) in its own
process and asserts: exit status 2, no traceback, one line on stderr that starts with
`easyvideor1 COMMAND:` and names the offending value. The structural check that nothing heavy
started: at exit the process writes the names of the modules it imported; `transformers` and
`vllm` (what any model load or engine needs) must be absent in every case, and `torch` too except
where the check needs the training config (whose registries import torch).

The model folder the cases pass where a model is well formed is complete on paper (a Qwen2.5-VL
config.json, tokenizer, processor config) but its weights file is empty: a command that got as far
as loading it would fail with a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import forkserver  # noqa: E402  (the cases start from a server that has imported no torch: PRELOADS["cli"])

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "demo_cpu.yaml")
PROBE = ("import atexit, json, os, sys\n"
         "atexit.register(lambda: open(os.environ['EV1_CLI_ERRORS_MODULES'], 'w').write(json.dumps(sorted(\n"
         "    m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vllm')))))\n"
         "from easyvideor1.cli import main\n"
         "sys.exit(main(sys.argv[1:]))\n")


def _files(root: Path) -> dict[str, str]:
    """The paths the cases name: a model folder, broken ones, data, responses, configs, results."""
    def model(name: str, config: dict | None, files=("tokenizer.json", "processor_config.json", "model.safetensors")):
        folder = root / name
        folder.mkdir()
        if config is not None:
            (folder / "config.json").write_text(json.dumps(config))
        for f in files:
            (folder / f).write_text("")
        return str(folder)

    data = root / "data.jsonl"
    data.write_text(json.dumps({"problem_id": "a", "problem": "2+2?", "answer": "4", "problem_type": "numerical",
                                "data_type": "image", "images": ["a.png"]}) + "\n")
    (root / "responses.jsonl").write_text(json.dumps({"problem_id": "a", "response": "4"}) + "\n")
    (root / "broken.yaml").write_text("training: {steps: [1,\n")
    results = root / "results"
    results.mkdir()
    (results / "settings.json").write_text("{}")
    (root / "empty").mkdir()
    return {
        "MODEL": model("model", {"model_type": "qwen2_5_vl"}),
        "EMPTY": str(root / "empty"),
        "FOREIGN": model("foreign", {"model_type": "llama"}),
        "NOPROC": model("noproc", {"model_type": "qwen2_5_vl"}, ("tokenizer.json", "model.safetensors")),
        "DATA": str(data),
        "RESP": str(root / "responses.jsonl"),
        "CONFIG": CONFIG,
        "BROKEN": str(root / "broken.yaml"),
        "RESULTS": str(results),
        "OUT": str(root / "out"),
    }


# (argv, text the message must hold, whether the check may import torch: only training configs)
CASES = [
    # synth
    ("synth --out /proc/nope", "/proc/nope", False),
    ("synth --out DATA", "is a file", False),
    ("synth --out OUT --num-train -1", "--num-train -1", False),
    ("synth --out OUT --num-val abc", "'abc'", False),
    # check-data
    ("check-data nofile.jsonl", "nofile.jsonl", False),
    ("check-data CONFIG", "is a YAML config", False),
    ("check-data EMPTY", "is a folder", False),
    ("check-data DATA --data-root /nonexistent", "/nonexistent", False),
    # cache
    ("cache --data nofile.jsonl --out OUT", "nofile.jsonl", False),
    ("cache --data DATA --out /proc/nope", "/proc/nope", False),
    ("cache --data DATA --out OUT --fps 0", "--fps 0", False),
    ("cache --data DATA --out OUT --family llama", "'llama'", False),
    ("cache --data DATA --out OUT --preset qwen9", "'qwen9'", False),
    ("cache --data DATA --out OUT --video-min-pixels 100 --video-max-pixels 50", "video_min_pixels (100)", False),
    # tiny-model
    ("tiny-model --family qwen9 --out OUT", "'qwen9'", False),
    ("tiny-model --family qwen2_5_vl --out /proc/nope", "/proc/nope", False),
    ("tiny-model --family qwen2_5_vl --out DATA", "is a file", False),
    # score
    ("score --data nofile.jsonl --responses RESP", "nofile.jsonl", False),
    ("score --data DATA --responses nofile.jsonl", "nofile.jsonl", False),
    ("score --data CONFIG --responses RESP", "is a YAML config", False),
    ("score --data DATA --responses RESP --format-weight 2", "--format-weight 2", False),
    ("score --data DATA --responses RESP --out /proc/nope/x.jsonl", "/proc/nope", False),
    # train
    ("train DATA", "is a sample file, not a YAML config", False),
    ("train nofile.yaml", "nofile.yaml", False),
    ("train CONFIG training.steps", "'training.steps'", False),
    ("train BROKEN", "broken.yaml: not a valid YAML config", True),
    ("train training.stepz=3", "stepz", True),
    ("train model.path=/nonexistent data.train_files=DATA", "model.path /nonexistent: no such folder", True),
    ("train model.path=EMPTY data.train_files=DATA", "no config.json", True),
    ("train model.path=FOREIGN data.train_files=DATA", "'llama'", True),
    ("train model.path=MODEL data.train_files=nofile.jsonl", "data.train_files nofile.jsonl", True),
    ("train model.path=MODEL data.train_files=DATA training.steps=-5", "training.steps must be >= 1, got -5", True),
    ("train model.path=MODEL data.train_files=DATA logging.out_dir=/proc/nope", "/proc/nope", True),
    ("train model.path=MODEL data.train_files=DATA vision.family=qwen3_vl", "set vision.family=qwen2_5_vl", True),
    # a flag for a config field: the override to write instead (the config tree imports torch)
    ("train CONFIG --steps 5", "unrecognized arguments: --steps 5; write training.steps=5: config fields are "
                               "section.key=value overrides, listed by `easyvideor1 train --help-config`", True),
    ("train CONFIG --bogus", "--bogus: config fields are section.key=value overrides", True),
    # export
    ("export nofile.yaml --out OUT", "config nofile.yaml", False),
    ("export DATA --out OUT", "is a sample file", False),
    ("export model.path=MODEL --out OUT --checkpoint /nonexistent", "--checkpoint /nonexistent", False),
    ("export model.path=MODEL logging.out_dir=EMPTY --out OUT", "no checkpoint under", True),
    ("export CONFIG --out OUT --lr=1e-3", "write training.lr=1e-3", True),
    ("plan CONFIG --rollout-batch-size 4", "write training.rollout_batch_size=4", True),
    # demo
    ("demo --steps -5 --out OUT", "--steps -5", False),
    ("demo --out /proc/nope", "/proc/nope", False),
    ("demo --out OUT --val-samples 0", "--val-samples 0", False),
    ("demo --out OUT training.stepz=1", "stepz", True),
    # eval
    ("eval --model /nonexistent --benchmarks DATA --out OUT", "--model /nonexistent: no such folder", False),
    ("eval --model Qwen/Qwen2.5-VL-7B-Instruct --benchmarks DATA --out OUT",
     "huggingface-cli download Qwen/Qwen2.5-VL-7B-Instruct", False),
    ("eval --model EMPTY --benchmarks DATA --out OUT", "no config.json", False),
    ("eval --model FOREIGN --benchmarks DATA --out OUT", "'llama'", False),
    ("eval --model NOPROC --benchmarks DATA --out OUT", "no processor file", False),
    ("eval --model DATA --benchmarks DATA --out OUT", "is a file", False),
    ("eval --model MODEL --benchmarks nosuchbench --out OUT", "'nosuchbench': unknown benchmark", False),
    ("eval --model MODEL --benchmarks videomme --out OUT", "give --data-root DIR", False),
    ("eval --model MODEL --benchmarks videomme --data-root EMPTY --out OUT", "no annotation file", False),
    ("eval --model MODEL --benchmarks nofile.jsonl --out OUT", "nofile.jsonl", False),
    ("eval --model MODEL --benchmarks DATA --out /proc/nope", "/proc/nope", False),
    ("eval --model MODEL --benchmarks DATA --out OUT --max-frames 0", "--max-frames 0", False),
    ("eval --model MODEL --benchmarks DATA --out OUT --gpu-memory-utilization 1.5", "1.5", False),
    ("eval --model MODEL --benchmarks DATA --out OUT --judge-endpoint http://judge", "--judge-model", False),
    ("eval --model MODEL --benchmarks DATA --out OUT --dtype float8", "'float8'", False),
    ("eval --model MODEL --benchmarks DATA --out OUT --bogus 1", "unrecognized arguments: --bogus 1 (see", False),
    ("eval --model MODEL --benchmarks DATA --out OUT --cache-mode cache_only --cache-dir /nonexistent",
     "--cache-dir /nonexistent", False),
    # report
    ("report /nonexistent", "/nonexistent", False),
    ("report EMPTY", "no settings.json", False),
    ("report RESULTS RESULTS", "--out", False),
    ("report RESULTS --out /proc/nope", "/proc/nope", False),
    ("report RESULTS --compare /nonexistent", "--compare /nonexistent", False),
    # pass-rate
    ("pass-rate --model /nonexistent --data DATA --out OUT", "/nonexistent", False),
    ("pass-rate --model MODEL --data nofile.jsonl --out OUT", "nofile.jsonl", False),
    ("pass-rate --model MODEL --data CONFIG --out OUT", "is a YAML config", False),
    ("pass-rate --model MODEL --data DATA --out OUT --k 0", "--k 0", False),
    ("pass-rate --model MODEL --data DATA --out OUT --min 0.8 --max 0.2", "--min 0.8 --max 0.2", False),
    ("pass-rate --model MODEL --data DATA --out OUT --preset qwen9", "'qwen9'", False),
    ("pass-rate --model MODEL --data DATA --out OUT --vision max_framez=3", "max_framez", False),
    ("pass-rate --model MODEL --data DATA --out OUT --engine tgi", "'tgi'", False),
    # trajectories
    ("trajectories --data DATA --out OUT/t.jsonl", "give --teacher DIR", False),
    ("trajectories --data DATA --out OUT/t.jsonl --teacher MODEL --endpoint http://host/v1", "only one", False),
    ("trajectories --data DATA --out OUT/t.jsonl --teacher /nonexistent", "--teacher /nonexistent", False),
    ("trajectories --data DATA --out OUT/t.jsonl --endpoint ftp://host --endpoint-model m", "ftp://host", False),
    ("trajectories --data DATA --out OUT/t.jsonl --endpoint http://host:8000/v1", "--endpoint-model", False),
    ("trajectories --data DATA --out EMPTY --teacher MODEL", "is a folder", False),
    ("trajectories --data DATA --out OUT/t.jsonl --teacher MODEL --min-accuracy 2", "--min-accuracy 2", False),
    # no such command
    ("evaluate --model MODEL", "'evaluate'", False),
]


def _run(argv: list[str], tmp: Path, index: int, extra_env: dict[str, str] | None = None):
    modules = tmp / f"modules-{index}.json"
    env = {**os.environ, "EV1_CLI_ERRORS_MODULES": str(modules), "OMP_NUM_THREADS": "1"}
    env.pop("EASYVIDEOR1_DEBUG", None)
    env.update(extra_env or {})
    # Forked from a server that has imported none of torch, transformers or vLLM (forkserver.PRELOADS).
    proc = forkserver.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env,
                          cwd=tmp, timeout=300, preload="cli")
    return proc, json.loads(modules.read_text()) if modules.exists() else None


def _substitute(word: str, files: dict[str, str]) -> str:
    """A case's word with its placeholder (MODEL, DATA, ...; also after `key=`) made a path."""
    if "=" in word:
        key, value = word.split("=", 1)
        return f"{key}={_substitute(value, files)}"
    for name, path in files.items():
        if word.startswith(name):
            return path + word[len(name):]
    return word


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case run once, four processes at a time."""
    tmp = tmp_path_factory.mktemp("cli_errors")
    files = _files(tmp)
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda i: _run([_substitute(w, files) for w in CASES[i][0].split()], tmp, i),
                             range(len(CASES))))


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_bad_argument_is_one_line_exit_2_before_any_model(outcomes, index):
    line, needle, may_import_torch = CASES[index]
    proc, modules = outcomes[index]
    command = line.split()[0]
    err = proc.stderr.strip()
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"easyvideor1 {command}:") or command == "evaluate", err
    assert needle in err, err
    assert modules is not None
    assert not [m for m in modules if m.split(".")[0] in ("transformers", "vllm")], modules
    assert may_import_torch or "torch" not in modules, modules


def test_debug_shows_the_traceback_of_a_user_error(tmp_path):
    for argv, env in ((["--debug", "export", "nofile.yaml", "--out", "x"], {}),
                      (["export", "nofile.yaml", "--out", "x"], {"EASYVIDEOR1_DEBUG": "1"})):
        proc, _ = _run(argv, tmp_path, 0, env)
        assert proc.returncode == 2
        assert "Traceback" in proc.stderr and "UserError" in proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("easyvideor1 export: config nofile.yaml")


def test_a_message_over_several_lines_is_printed_on_one():
    from easyvideor1.cli import one_line

    assert one_line("bench.json: 2 bad record(s):\n  record 3: no answer\n  record 7: no video\nfix them.") == (
        "bench.json: 2 bad record(s): record 3: no answer; record 7: no video; fix them.")
