"""Chaos: SIGKILL the real `cache`, `train` and `eval` commands at seeded random moments, re-run
them to completion, and check that nothing was lost, doubled or changed.

For each command a reference run goes uninterrupted first. Then one output folder goes
through a chain of killed runs, each started on what the previous one left and SIGKILLed
either at a named point inside a critical write (`easyvideor1.testhooks`: inside a checkpoint
write, with half a result row on disk, an entry's temporary file written but not renamed, the
manifest read but not written) or after a seeded random delay (20-100% of the reference
run's wall time). A last run then completes, and the folder is checked:

- cache: after every kill, every entry on disk loads in full and equals the reference's (a
  reader never finds a partial entry); at the end `cache --verify` rebuilds nothing and the
  manifest lists every sample exactly once;
- train (checkpoint every step, CPU fp32): final parameters `torch.equal` the reference's, and
  so are the data order (first sample of each step) and the logged rewards of every step;
- eval: every sample exactly once in the results, with the reference's scores and responses.

A kill that came after the run had already finished (a timer longer than the run, a named
point the run never reached) is counted as missed, not as a kill: that folder is checked as
complete, and the kill is tried again on a fresh folder (a timer then at 20-90% of the
finished run's time), so every planned kill lands.

- train_async (rollout.placement=separate, max_staleness 1, checkpoint every 2 steps): as train;
  train_async2 the same with 2 rollout processes.

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/chaos.py [--kills 10] [--seed 0] [--only cache,train,eval]
       (--only train_async,train_async2: the asynchronous cases, not in the default list)
Prints a table: command, runs, kill points (landed), failures. The fast version (3 kill points
each) is tests/test_chaos.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: timings swing without it
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.testhooks import ENV as HOOK_ENV
from easyvideor1.vision.cache import read_entry

TIMEOUT_S = 1800  # ends a hang of one run
# Named points per command, in the order the chain uses them (`point:nth:kill`).
CACHE_POINTS = ("cache.entry:2:kill", "cache.merge:1:kill", "cache.entry:1:kill")
TRAIN_POINTS = ("checkpoint.write:1:kill", "checkpoint.write:2:kill", "checkpoint.write:1:kill")
EVAL_POINTS = ("results.flush:2:kill", "results.flush:1:kill", "results.flush:3:kill")


@dataclass
class Kill:
    """Where one run of a chain dies: at a named point (`hook`), or `delay_s` after its start."""

    hook: str | None = None
    delay_s: float = 0.0

    def label(self) -> str:
        return self.hook.rsplit(":", 1)[0] if self.hook else f"t+{self.delay_s:.1f}s"


@dataclass
class CaseResult:
    command: str
    runs: int = 0
    kills: list[str] = field(default_factory=list)  # the kills that landed
    missed: list[str] = field(default_factory=list)  # runs that finished before their kill
    failures: list[str] = field(default_factory=list)


def plan(points: tuple[str, ...], count: int, horizon_s: float, rng: random.Random) -> list[Kill]:
    """`count` kills: the named points first (cycled), every other one a random moment."""
    kills = []
    for i in range(count):
        if i % 2 == 0:
            kills.append(Kill(hook=points[(i // 2) % len(points)]))
        else:
            kills.append(Kill(delay_s=rng.uniform(0.2, 1.0) * horizon_s))
    return kills


# How the commands start: `subprocess`'s functions here; the test suite gives its fork server's
# (tests/forkserver.py: same arguments, children that skip the imports).
run, Popen = subprocess.run, subprocess.Popen


def _env(hook: str = "") -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", HOOK_ENV: hook}


def run_to_end(cmd: list[str], log: Path, ok_codes=(0,)) -> float:
    """Run `cmd` uninterrupted; return its wall time (raises with the log's tail on failure)."""
    start = time.monotonic()
    with open(log, "w") as f:
        code = run(cmd, env=_env(), stdout=f, stderr=subprocess.STDOUT, timeout=TIMEOUT_S).returncode
    if code not in ok_codes:
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {code}:\n{log.read_text()[-3000:]}")
    return time.monotonic() - start


def killed_run(cmd: list[str], kill: Kill, log: Path) -> tuple[bool, float]:
    """Start `cmd` and SIGKILL it as `kill` says; (True when the kill landed before the end,
    the run's wall time)."""
    start = time.monotonic()
    with open(log, "w") as f:
        proc = Popen(cmd, env=_env(kill.hook or ""), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=kill.delay_s if kill.hook is None else TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the command and any worker it started
            proc.wait()
            wait_until_dead(proc.pid)
            return True, time.monotonic() - start
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # workers left behind by a self-kill
    except ProcessLookupError:
        pass
    wait_until_dead(proc.pid)
    return code == -signal.SIGKILL, time.monotonic() - start


def wait_until_dead(group: int) -> None:
    """Until process group `group` has no live process (a zombie is dead): `wait` covers the
    leader only, and the next run must not start while a worker of the killed one still runs."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        alive = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            alive |= int(fields[2]) == group and fields[0] != "Z"
        if not alive:
            return
        time.sleep(0.01)
    raise RuntimeError(f"process group {group} still alive {TIMEOUT_S} s after SIGKILL")


def chain(result: CaseResult, cmd_for: Callable[[Path], list[str]], folders: Path, kills: list[Kill],
          after_kill: Callable[[Path], list[str]], at_end: Callable[[Path], list[str]], rng: random.Random,
          ok_codes=(0,)) -> None:
    """Kill runs on one output folder, one after the other, each started on what the previous
    left (`after_kill` checks the folder after each), then run it to completion and check it
    (`at_end`). A run that finished before its kill ends the chain there (it is checked) and
    the kill is tried again on a fresh folder: a timer at a random moment of that run's length,
    a named point as it was."""
    count = 0

    def fresh() -> Path:
        nonlocal count
        count += 1
        return folders / f"{result.command}-{count}"

    folder = fresh()
    for i, kill in enumerate(kills):
        for attempt in range(4):
            landed, seconds = killed_run(cmd_for(folder), kill, folders / f"{result.command}-{i}-{attempt}.log")
            result.runs += 1
            if landed:
                result.kills.append(kill.label())
                result.failures += [f"after kill {i} ({kill.label()}): {f}" for f in after_kill(folder)]
                break
            result.missed.append(kill.label())
            result.failures += [f"chain {folder.name}: {f}" for f in at_end(folder)]
            folder = fresh()
            if kill.hook is None:
                kill = Kill(delay_s=rng.uniform(0.2, 0.9) * seconds)
    try:
        run_to_end(cmd_for(folder), folders / f"{result.command}-final.log", ok_codes)
        result.failures += [f"chain {folder.name}: {f}" for f in at_end(folder)]
    except RuntimeError as e:
        result.failures.append(f"final run: {e}")
    result.runs += 1


# ---------------------------------------------------------------- cache

def cache_cmd(data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "easyvideor1.cli", "cache", "--data", str(data), "--out", str(out),
            "--workers", "0", "--fps", "2", "--video-max-frames", "4", "--video-max-pixels", str(56 * 56),
            "--video-min-pixels", str(28 * 28), "--image-max-pixels", str(56 * 56), "--no-progress", *extra]


def _entries(cache: Path) -> dict[str, Path]:
    return {p.name: p for p in (cache / "entries").glob("*/*.safetensors")}


def cache_case(root: Path, kills: int, seed: int) -> CaseResult:
    result = CaseResult("cache")
    data = write_suite(root / "data", num_train=8, num_val=0, seed=seed)["train"]
    ids = [json.loads(line)["problem_id"] for line in data.read_text().splitlines()]
    horizon = run_to_end(cache_cmd(data, root / "reference"), root / "cache-reference.log")
    reference = _entries(root / "reference")

    def entries_whole(out: Path) -> list[str]:
        bad = []
        for name, path in _entries(out).items():
            try:
                frames, _ = read_entry(path)
                if name not in reference or not torch.equal(frames.pixels, read_entry(reference[name])[0].pixels):
                    bad.append(f"{name} differs from the reference entry")
            except Exception as e:  # noqa: BLE001 - any failure to read is what we look for
                bad.append(f"{name} unreadable: {e}")
        return bad

    def complete(out: Path) -> list[str]:
        bad = entries_whole(out)
        verify = run(cache_cmd(data, out, "--verify"), env=_env(), capture_output=True, text=True,
                                timeout=TIMEOUT_S)
        result.runs += 1
        if verify.returncode != 0 or " 0 rebuilt" not in verify.stdout:
            bad.append(f"cache --verify: {verify.stdout[-500:]} {verify.stderr[-500:]}")
        manifest = [json.loads(line)["problem_id"] for line in (out / "manifest.jsonl").read_text().splitlines()]
        if sorted(manifest) != sorted(ids):
            bad.append(f"manifest lists {sorted(manifest)}, expected each of {sorted(ids)} once")
        if set(_entries(out)) != set(reference):
            bad.append("the entries differ from the reference build's")
        return bad

    chain(result, lambda out: cache_cmd(data, out), root, plan(CACHE_POINTS, kills, horizon, random.Random(seed)),
          entries_whole, complete, random.Random(seed + 1))
    return result


# ---------------------------------------------------------------- train

def train_config(root: Path, model: Path, data: Path, out: Path, steps: int, separate: int = 0) -> Path:
    """`separate`: rollout processes under rollout.placement=separate (0: colocated)."""
    cfg = {
        "vision": {"family": "qwen2_5_vl", "max_frames": 4, "video_min_pixels": 3136, "video_max_pixels": 3136,
                   "image_min_pixels": 3136, "image_max_pixels": 3136},
        "model": {"path": str(model), "dtype": "float32"},
        "rollout": {"engine": "hf", "n": 2, "max_tokens": 8, "temperature": 1.0},
        "algorithm": {"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean",
                      "disable_kl": True},
        "training": {"steps": steps, "rollout_batch_size": 2, "mini_batch_size": 2, "micro_batch_size": 2,
                     "lr": 1e-3, "seed": 0},
        "data": {"train_files": [str(data)], "shuffle": True},
        "logging": {"out_dir": str(out), "progress": False},
        "checkpoint": {"every": 1, "resume": "auto", "keep": 2},
    }
    if separate:  # rollout processes one step stale; checkpoints every 2 steps, so the schedule is stale
        cfg["rollout"]["placement"], cfg["training"]["max_staleness"], cfg["checkpoint"]["every"] = "separate", 1, 2
        cfg["rollout"]["processes"] = separate
    path = root / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _per_step(path: Path, key: str) -> dict[int, object]:
    """The last logged `key` of each step (a resumed run logs the steps after its checkpoint again)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {row["step"]: row.get(key) for row in rows}


def train_case(root: Path, kills: int, seed: int, steps: int = 4, separate: int = 0) -> CaseResult:
    result = CaseResult({0: "train", 1: "train_async"}.get(separate, f"train_async{separate}"))
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=seed)
    data = write_suite(root / "data", num_train=6, num_val=0, seed=seed)["train"]
    cmd = lambda out: [sys.executable, "-m", "easyvideor1.cli", "train",  # noqa: E731
                       str(train_config(root, model, data, out, steps, separate))]
    reference = root / "reference"
    horizon = run_to_end(cmd(reference), root / "train-reference.log")
    a = load_file(str(reference / "hf_model" / "model.safetensors"))

    def complete(out: Path) -> list[str]:
        bad = []
        b = load_file(str(out / "hf_model" / "model.safetensors")) if (out / "hf_model").exists() else {}
        if set(a) != set(b) or not all(torch.equal(a[k], b[k]) for k in a):
            bad.append("final parameters differ from the uninterrupted run")
        for what, file, key in (("rewards", "metrics.jsonl", "reward/all"), ("data order", "examples.jsonl", "sample")):
            want, got = _per_step(reference / file, key), _per_step(out / file, key)
            if got != want or sorted(got) != list(range(1, steps + 1)):
                bad.append(f"{what} per step {got} != uninterrupted {want}")
        leftovers = list((out / "checkpoints").glob("*.tmp-*"))
        if leftovers:
            bad.append(f"partial checkpoint folders left: {leftovers}")
        return bad

    # After a kill nothing is checked in the folder: a resume reads only renamed (complete)
    # checkpoint folders, and the next run's result is what `complete` compares.
    chain(result, cmd, root, plan(TRAIN_POINTS, kills, horizon, random.Random(seed)), lambda out: [], complete,
          random.Random(seed + 1))
    return result


# ---------------------------------------------------------------- eval

EVAL_CODE = """
import sys
from easyvideor1.errors import UserError
from easyvideor1.evaluation.evaluator import Evaluator, EvalOptions
from easyvideor1.evaluation.settings import DecodingSettings
from easyvideor1.vision.config import VisionConfig
model, data, out = sys.argv[1:4]
vision = VisionConfig(family="qwen2_5_vl", max_frames=4, video_min_pixels=3136, video_max_pixels=3136,
                      image_min_pixels=3136, image_max_pixels=3136)
ev = Evaluator(model, engine="hf", preset="qwen2_5_vl_greedy",
               options=EvalOptions(out_dir=out, cache_mode="realtime", dtype="float32", asynchronous=False,
                                   max_batch=1, load_workers=1),
               sampling=DecodingSettings(temperature=0, max_new_tokens=8), vision=vision)
try:
    ev.run([data])
except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
"""


def eval_cmd(model: Path, data: Path, out: Path) -> list[str]:
    return [sys.executable, "-c", EVAL_CODE, str(model), str(data), str(out)]


def _results(out: Path) -> list[dict]:
    path = out / "file-val.jsonl"
    if not path.exists():
        return []
    text = path.read_text()
    whole = text[: text.rfind("\n") + 1]  # a partial last line is the killed run's, redone on resume
    return [json.loads(line) for line in whole.splitlines()]


def eval_case(root: Path, kills: int, seed: int, model: Path | None = None) -> CaseResult:
    result = CaseResult("eval")
    model = model or build_tiny_model("qwen2_5_vl", root / "model", seed=seed)
    data = write_suite(root / "evaldata", num_train=0, num_val=6, seed=seed)["val"]
    horizon = run_to_end(eval_cmd(model, data, root / "eval-reference"), root / "eval-reference.log")
    want = {r["id"]: (r["score"], r["response"], r["status"]) for r in _results(root / "eval-reference")}

    def no_duplicates(out: Path) -> list[str]:
        ids = [r["id"] for r in _results(out)]
        return [f"duplicate result ids {ids}"] if len(ids) != len(set(ids)) else []

    def complete(out: Path) -> list[str]:
        rows = _results(out)
        got = {r["id"]: (r["score"], r["response"], r["status"]) for r in rows}
        if len(rows) != len(want) or got != want:
            return [f"results {sorted(got.items())} != uninterrupted {sorted(want.items())}"]
        return []

    chain(result, lambda out: eval_cmd(model, data, out), root, plan(EVAL_POINTS, kills, horizon,
          random.Random(seed)), no_duplicates, complete, random.Random(seed + 1))
    return result


CASES = {"cache": cache_case, "train": train_case, "eval": eval_case,
         # `rollout.placement=separate`: the trainer SIGKILLed (its rollout processes die with it), then resumed
         "train_async": lambda root, kills, seed: train_case(root, kills, seed, steps=6, separate=1),
         "train_async2": lambda root, kills, seed: train_case(root, kills, seed, steps=6, separate=2)}


def table(results: list[CaseResult]) -> str:
    lines = ["| command | runs | kill points (landed) | missed | failures |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.command} | {r.runs} | {len(r.kills)}: {', '.join(r.kills)} | {len(r.missed)} | "
                     f"{len(r.failures)} |")
    for r in results:
        lines += [f"{r.command}: {f}" for f in r.failures]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="kill points per command")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="cache,train,eval", help="comma-separated commands")
    parser.add_argument("--keep", default=None, help="folder to keep the runs in (default: a temp dir)")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="ev1-chaos-") as tmp:
        root = Path(args.keep or tmp)
        for name in args.only.split(","):
            folder = root / name
            folder.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            results.append(CASES[name](folder, args.kills, args.seed))
            print(f"{name}: {time.monotonic() - start:.0f}s", file=sys.stderr)
    print(table(results))
    return 1 if any(r.failures for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
