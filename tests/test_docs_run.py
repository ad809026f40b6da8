"""Getting started (sections 2-5) and the README's tour, run as a newcomer runs them.

Every `easyvideor1` line of those sections runs, in page order, in one scratch folder, as a real
process with every argument check (tests/test_docs.py only parses them). The sizes shrink
(`REWRITES`: fewer steps, samples and responses); nothing else changes. Each command must exit
0, every `--out` it names must then exist, and every `runs/...` path a section names in backticks
must exist once that section has run: what the page says it writes.

Not run: `make demo` (the full demo), torchrun on 8 GPUs, set-up (section 1).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

import docs_commands
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)
from docs_commands import ROOT, CommandLine
from easyvideor1 import arguments
from easyvideor1.errors import UserError

# (page, text that must occur in one of its commands, what it becomes): sizes only. Each one must
# match, so a page edited past a rewrite fails here rather than running at full size.
REWRITES = [
    ("docs/getting-started.md", "--steps 20 --train-samples 64", "--steps 2 --train-samples 16"),
    ("README.md", "synth --out data/synth", "synth --out data/synth --num-train 16 --num-val 8"),
    ("README.md", "training.steps=10", "training.steps=2"),
    ("README.md", "--k 8", "--k 2"),
    ("README.md", "--min-accuracy 0.5", "--min-accuracy 0.5 --k 2"),
]
NOT_RUN = ("make ", "torchrun ")  # the full demo, the 8-GPU run
SECTIONS = {"docs/getting-started.md": (r"^## 2\. ", r"^## 6\. "), "README.md": (r"^## A tour", r"^## On GPUs")}
WRITTEN = re.compile(r"`(runs/[^`\s]+)`")


def sections(page: str, text: str) -> list[tuple[str, int]]:
    """The sections of `page` to run: (their text, the line number they start at)."""
    first, end = SECTIONS[page]
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(first, line))
    stop = next(i for i, line in enumerate(lines) if re.match(end, line))
    heads = [i for i in range(start, stop) if lines[i].startswith("## ")] + [stop]
    return [("\n".join(lines[a:b]), a) for a, b in zip(heads, heads[1:])]


def commands(page: str, section: str, offset: int) -> list[CommandLine]:
    """The section's command lines, sizes rewritten (`page:line` counted in the whole page)."""
    out = []
    for c in docs_commands.shell_lines(section, page):
        line = int(c.source.rsplit(":", 1)[1]) + offset
        text = c.text
        for where, old, new in REWRITES:
            if where == page:
                text = text.replace(old, new)
        if not text.startswith(NOT_RUN):
            out.append(CommandLine(f"{page}:{line}", text))
    return out


def run_page(page: str, text: str, cwd: Path) -> list[tuple[str, str]]:
    """Run the page's sections in order in `cwd`; returns (command, its stdout) of each. Fails
    naming the line."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    ran = []
    for section, offset in sections(page, text):
        for c in commands(page, section, offset):
            words = shlex.split(c.text, comments=True)
            assert words[0] == "easyvideor1", f"{c.source}: {c.text}: only easyvideor1 lines run here"
            proc = forkserver.run([sys.executable, "-m", "easyvideor1.cli", *words[1:]], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=1800)  # the timeout only ends a hang
            assert proc.returncode == 0, (f"{c.source}: `{c.text}` exited {proc.returncode}:\n"
                                          f"{proc.stdout[-1500:]}\n{proc.stderr[-2500:]}")
            if "--out" in words:
                out = cwd / words[words.index("--out") + 1]
                assert out.exists(), f"{c.source}: `{c.text}` wrote no {out.relative_to(cwd)}"
            ran.append((c.text, proc.stdout))
        missing = [p for p in WRITTEN.findall(section) if "<" not in p and not (cwd / p).exists()]
        assert not missing, f"{page}:{offset + 1}: the section says it writes {missing}, which do not exist"
    return ran


def _scratch(tmp_path: Path) -> Path:
    """A folder like the repository root to a reader: configs/ beside them."""
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    return tmp_path


def test_rewrites_match_their_pages():
    for page, old, _ in REWRITES:
        assert old in (ROOT / page).read_text(), f"{page} no longer shows {old!r}: update REWRITES"


def test_getting_started_runs_as_written(tmp_path):
    cwd = _scratch(tmp_path)
    ran = run_page("docs/getting-started.md", (ROOT / "docs/getting-started.md").read_text(), cwd)
    assert [c.split()[1] for c, _ in ran] == ["demo", "eval", "eval", "report", "export"]
    # The page's eval line is the one the demo prints to run next.
    assert ran[1][0] in ran[0][1].replace("\n  ", " "), ran[0][1][-600:]
    assert "settings from runs/demo-short/hf_model/easyvideor1.json" in ran[1][1] and "engine: hf (auto" in ran[1][1]
    # eval given the demo's checkpoint or run folder says what to give instead
    with pytest.raises(UserError, match=r"is a training checkpoint, not an HF-format model; export it first, "
                                        r"`easyvideor1 export \S+step-000002 --out \S+/train/hf_model`"):
        arguments.model_folder("--model", str(cwd / "runs/demo-short/train/checkpoints/step-000002"))
    with pytest.raises(UserError, match=r"is a training run's folder, not a model; its trained model is "
                                        r"\S+runs/demo-short/hf_model"):
        arguments.model_folder("--model", str(cwd / "runs/demo-short"))
    # The trained model carries its training settings, and eval used them with no flag typed.
    carried = json.loads((cwd / "runs/demo-short/hf_model/easyvideor1.json").read_text())
    from easyvideor1.config import demo_config_path, load_config
    from easyvideor1.evaluation.settings import template_digest
    from easyvideor1.training.demo import demo_template_path

    demo = load_config(demo_config_path())
    for results in ("runs/demo-short/eval", "runs/demo-short/eval-base"):
        stored = json.loads((cwd / results / "settings.json").read_text())
        s = stored["settings"]
        for key in ("fps", "min_frames", "max_frames", "video_min_pixels", "video_max_pixels", "video_total_pixels",
                    "image_min_pixels", "image_max_pixels"):
            assert s[f"vision.{key}"] == getattr(demo.vision, key) == carried["vision"][key], (results, key)
        assert s["prompt_digest"] == template_digest(demo_template_path()), results
        assert s["sampling.max_new_tokens"] == demo.rollout.max_tokens and s["engine"] == "hf"
        assert stored["sources"]["dtype"] == demo.model.dtype and stored["sources"]["flags"] == {}
        assert stored["sources"]["carried"] == "runs/demo-short/hf_model/easyvideor1.json", stored["sources"]
    rows = (cwd / "runs/demo-short/eval/file-val.jsonl").read_text().splitlines()
    assert len(rows) == 16 and all(json.loads(r)["status"] == "ok" for r in rows)
    # The demo itself (what test_demo_smoke checked): the table, both validations, one metrics row per step.
    results = json.loads((cwd / "runs/demo-short/train/demo_results.json").read_text())
    for task in ("colour", "motion", "count", "presence", "when", "where", "image_colour", "image_count"):
        assert f"val/accuracy/{task}" in results["after"], task
    steps = [json.loads(line)["step"] for line in (cwd / "runs/demo-short/train/metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert "Validation (greedy)" in (cwd / "runs/demo-short/train/report/README.md").read_text()
    assert (cwd / "runs/demo-short/train/checkpoints/step-000002/config.yaml").is_file()
    exported = json.loads((cwd / "runs/demo-short/exported/easyvideor1.json").read_text())
    assert exported["vision"] == carried["vision"] and exported["source"]["step"] == 2
    _eval_prompts_are_trainings(cwd / "runs/demo-short")


def _eval_prompts_are_trainings(demo: Path) -> None:
    """Scored as trained: with no flag, eval's prompt of every held-out sample is the one training
    built (its run config, recorded in the checkpoint): the same token ids, frames and pixels."""
    from functools import partial

    import torch

    from easyvideor1.data.templates import render_prompt
    from easyvideor1.evaluation.adapters import get_benchmark
    from easyvideor1.evaluation.carried import start
    from easyvideor1.evaluation.evaluator import Evaluator, options_from
    from easyvideor1.evaluation.presets import Overrides
    from easyvideor1.prompts import PromptBuilder
    from easyvideor1.training.state.checkpoint import named_by, recorded_config
    from easyvideor1.vision.cache import FrameSource

    model = str(demo / "hf_model")
    begin = start(model, None, None, Overrides(), None, None)
    options = options_from(template_dir=begin.template, dtype=begin.dtype, cache_dir=str(demo / "cache"),
                           out_dir=str(demo / "eval-prompts"))
    ev = Evaluator(model, engine="hf", preset=begin.preset, options=options, overrides=begin.overrides)
    cfg = recorded_config(named_by(demo))
    trained = PromptBuilder(FrameSource(cfg.vision, cfg.data.cache_dir, cfg.data.cache_mode), ev.processor, ev.family,
                            ev.spec, render=partial(render_prompt, template_dir=cfg.data.template_dir),
                            max_prompt_tokens=cfg.data.max_prompt_tokens)
    bench = get_benchmark(str(demo / "data" / "val.jsonl"))
    samples = bench.load(None)
    assert len(samples) == 16
    for sample in samples:
        a, b = ev.prepare(bench, sample).inputs, trained.build(sample).inputs
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.position_ids, b.position_ids), sample.problem_id
        for name in ("pixel_values", "pixel_values_videos", "video_grid_thw", "image_grid_thw"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or torch.equal(x, y), (sample.problem_id, name)


def test_readme_tour_runs_as_written(tmp_path):
    cwd = _scratch(tmp_path)
    ran = run_page("README.md", (ROOT / "README.md").read_text(), cwd)
    assert [c.split()[1] for c, _ in ran] == ["synth", "check-data", "tiny-model", "cache", "train", "eval", "report",
                                           "pass-rate", "trajectories"]
    stored = json.loads((cwd / "runs/eval/settings.json").read_text())
    assert stored["sources"]["carried"] == "runs/train/hf_model/easyvideor1.json"
    assert stored["settings"]["vision.max_frames"] == 8  # the training budget, not the preset's 768


PLANTED = """## 2. A page with a broken command

```bash
easyvideor1 synth --out runs/s --num-train 8 --num-val 8
easyvideor1 eval --model runs/s --benchmarks runs/s/val.jsonl --out runs/e
```

## 6. Next
"""


def test_a_planted_broken_command_fails_the_run(tmp_path):
    """The second line parses (the parser-only check passes it) but is refused when run: the run
    names it. A path the page claims and no command writes fails it too."""
    broken = CommandLine("page.md:5", "easyvideor1 eval --model runs/s --benchmarks runs/s/val.jsonl --out runs/e")
    assert docs_commands.check(broken) is None
    with pytest.raises(AssertionError, match=r"docs/getting-started.md:5: `easyvideor1 eval --model runs/s .*"
                                             r"exited 2:[\s\S]*--model runs/s: no config.json"):
        run_page("docs/getting-started.md", PLANTED, _scratch(tmp_path))
    claimed = PLANTED.replace("easyvideor1 eval --model runs/s --benchmarks runs/s/val.jsonl --out runs/e\n", "")
    claimed = claimed.replace("## 6.", "It writes `runs/s/train.jsonl` and `runs/s/labels.csv`.\n\n## 6.")
    with pytest.raises(AssertionError, match=r"says it writes \['runs/s/labels.csv'\]"):
        run_page("docs/getting-started.md", claimed, tmp_path)
