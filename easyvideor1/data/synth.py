"""The built-in synthetic task suite: the embedded default data.

Small mp4 clips of coloured squares that appear, move and disappear, a few images, and
`train.jsonl` / `val.jsonl` in the sample schema, deterministic by seed. Every task has a
verifiable answer that can only be read from the pixels (the question text never names the
answer), and every record carries a correct `offline_output` for hybrid training: a short thought
naming what is seen, then the answer (short, so it fits a small response budget).

Tasks (problem_type in brackets; chance level in `CHANCE`):
  colour    [multiple choice]      colour of the single square (A-D, fixed option order)
  motion    [multiple choice]      direction the square moves (A-D, fixed option order)
  count     [numerical]            number of squares, 1-4
  presence  [boolean]              is there a square at all? (balanced yes/no; shown for 1-4 s)
  when      [temporal grounding]   [start, end] seconds during which the square is visible
  where     [spatial grounding]    box [x1, y1, x2, y2] (source pixels) of the square
  image_colour, image_count        the colour / count questions on a still image
  flash     [multiple choice]      (opt-in, not in TASKS) colour of a square that flashes for
                                   FLASH_FRAMES frames (0.25 s) inside a stated 1-s window of an
                                   8-s clip: sampled at the demo's rate most flashes fall between
                                   frames; a `crop_video` of the window shows it (issue 28)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from easyvideor1.rewards.multiple_choice import LETTERS
from easyvideor1.vision.encode import write_video

COLOURS = {"red": (230, 30, 30), "green": (30, 200, 30), "blue": (40, 60, 235), "yellow": (235, 220, 30)}
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
TASKS = ("colour", "motion", "count", "presence", "when", "where", "image_colour", "image_count")
OPT_IN_TASKS = ("flash",)  # written only when asked for (`easyvideor1 synth --tasks`)
# The tools a task's samples are offered (record field `tools`). A suite that holds one of these
# tasks gives every other row `tools: []`, so only these prompts carry the tools' system text.
TASK_TOOLS = {"flash": ["crop_video"]}
FLASH_SECONDS, FLASH_FRAMES = 8, 2
FLASH_WINDOW_RE = re.compile(r"starts at second (\d+)")


def flash_call(window: int) -> str:
    """The `crop_video` call of a flash sample's window, as the model writes it (Qwen's format)."""
    return f'<tool_call>\n{{"name": "crop_video", "arguments": {{"start": {window}, "end": {window + 1}}}}}\n</tool_call>'
# The demo's suite (`easyvideor1 demo`): 256 training samples per task, so every combination a
# task can show is seen in training (with 64, two of presence's 16 asked x shown colour pairs
# were missing from training but not from validation); 24 held-out samples per task (with 12,
# one answer moved a task's score by 0.08).
DEMO_TRAIN, DEMO_VAL = 2048, 192
# The demo's training mix: motion (the one task that needs time compared across frames) three
# times the share of each other task. It moved from chance only after ~5,000 training examples
# (README before issue 14: 0.96 after 2,875 steps at 2 motion samples a step, 0.25 after 1,778);
# the other tasks need far fewer. Held-out samples stay an equal share per task.
DEMO_TRAIN_MIX = ("colour", "motion", "count", "motion", "presence", "when", "motion", "where",
                  "image_colour", "image_count")
# `demo --tools`: flash joins the mix at five shares (each other task has one, motion three). Its
# call must copy the window's start from the question, which the tiny model learns late and
# suddenly (supervised on the call alone: chance until ~550 steps of 16 flash samples, 1.00 at
# 650); at three shares with calls worded otherwise the greedy calls named the window in 5 of 24
# held-out samples after 1,800 steps (flash 0.21), at one share flash reached 0.38.
DEMO_TOOLS_MIX = DEMO_TRAIN_MIX + ("flash",) * 5
# Chance accuracy of a uniform guess (grounding: expected IoU of a random guess is reported
# by the evaluator from the data; these are the classification tasks' levels).
CHANCE = {"colour": 0.25, "flash": 0.25, "motion": 0.25, "count": 0.25, "presence": 0.5,
          "image_colour": 0.25, "image_count": 0.25}


@dataclass(frozen=True)
class SynthConfig:
    size: int = 112  # frame side, pixels (a multiple of 28 and 16)
    cell: int = 56  # square side and position grid, pixels: a 2x2 grid (28 -> 4x4 is far
    # harder: a tiny model's SFT ceiling after 600 steps was ~0.5 on it, ~0.75 on 2x2)
    fps: int = 8  # source frame rate
    seconds: int = 4  # clip length


def _canvas(cfg: SynthConfig, frames: int) -> np.ndarray:
    return np.zeros((frames, cfg.size, cfg.size, 3), dtype=np.uint8)  # [T, H, W, 3]


def _draw(canvas: np.ndarray, x: int, y: int, side: int, rgb) -> None:
    canvas[..., y:y + side, x:x + side, :] = rgb


def _cells(cfg: SynthConfig) -> int:
    return cfg.size // cfg.cell


def _record(pid, task, problem, answer, ptype, thought, data_type, media, options=None):
    rec = {
        "problem_id": pid, "problem": problem, "answer": answer, "problem_type": ptype,
        "data_type": data_type, "data_source": f"synthetic/{task}", "task": task,
        "offline_output": f"<think>{thought}</think><answer>{answer}</answer>",
    }
    rec["videos" if data_type == "video" else "images"] = [media]
    if options:
        rec["options"] = options
    return rec


def _make_task(task: str, rng: np.random.Generator, cfg: SynthConfig):
    """Return (pixels [T,H,W,3] uint8, problem, answer, problem_type, thought, options)."""
    n_frames, cells = cfg.fps * cfg.seconds, _cells(cfg)
    colour_names = list(COLOURS)
    if task in ("colour", "image_colour"):
        c = int(rng.integers(4))
        px = _canvas(cfg, 1 if task == "image_colour" else n_frames)
        gx, gy = rng.integers(cells, size=2) * cfg.cell
        _draw(px, int(gx), int(gy), cfg.cell, COLOURS[colour_names[c]])
        what = "image" if task == "image_colour" else "video"
        options = [f"{LETTERS[i]}. {name}" for i, name in enumerate(colour_names)]
        return px, f"What colour is the square in the {what}?", LETTERS[c], "multiple choice", \
            colour_names[c], options
    if task == "motion":
        d = int(rng.integers(4))
        name, (dx, dy) = list(DIRECTIONS.items())[d]
        px = _canvas(cfg, n_frames)
        span = cfg.size - cfg.cell
        rgb = COLOURS[colour_names[int(rng.integers(4))]]
        other = int(rng.integers(span + 1))
        for t in range(n_frames):
            pos = round(span * t / (n_frames - 1))
            along = pos if (dx > 0 or dy > 0) else span - pos
            x, y = (along, other) if dx else (other, along)
            _draw(px[t], x, y, cfg.cell, rgb)
        options = [f"{LETTERS[i]}. {n}" for i, n in enumerate(DIRECTIONS)]
        return px, "In which direction does the square move?", LETTERS[d], "multiple choice", \
            name, options
    if task in ("count", "image_count"):
        k = int(rng.integers(1, 5))
        px = _canvas(cfg, 1 if task == "image_count" else n_frames)
        for cell in rng.choice(cells * cells, size=k, replace=False):
            gy, gx = divmod(int(cell), cells)
            _draw(px, gx * cfg.cell, gy * cfg.cell, cfg.cell, COLOURS[colour_names[int(rng.integers(4))]])
        what = "image" if task == "image_count" else "video"
        return px, f"How many squares are in the {what}?", str(k), "numerical", f"{k} squares", None
    if task == "presence":
        # Any square at all, visible for some whole seconds (balanced yes/no). Asking for a
        # named colour ("is there a red square?") needs the answer to compare a word of the
        # question with the colour seen: the tiny model stayed at chance on that after 1,778
        # steps (training accuracy 0.45-0.55 throughout), while this form was at 1.00 after 400.
        present = bool(rng.integers(2))
        px = _canvas(cfg, n_frames)
        seen = "nothing"
        if present:
            start = int(rng.integers(0, cfg.seconds))
            end = int(rng.integers(start + 1, cfg.seconds + 1))
            seen = colour_names[int(rng.integers(4))]
            gx, gy = rng.integers(cells, size=2) * cfg.cell
            _draw(px[start * cfg.fps:end * cfg.fps], int(gx), int(gy), cfg.cell, COLOURS[seen])
        return px, "Is there a square in the video?", "yes" if present else "no", "boolean", seen, None
    if task == "when":
        start = int(rng.integers(0, cfg.seconds))
        end = int(rng.integers(start + 1, cfg.seconds + 1))
        px = _canvas(cfg, n_frames)
        gx, gy = rng.integers(cells, size=2) * cfg.cell
        _draw(px[start * cfg.fps:end * cfg.fps], int(gx), int(gy), cfg.cell,
              COLOURS[colour_names[int(rng.integers(4))]])
        ans = json.dumps([start, end])
        return px, "During which seconds is the square visible? Give [start, end] in seconds.", ans, \
            "temporal grounding", f"{start} to {end}", None
    if task == "where":
        t = int(rng.integers(cfg.seconds))
        px = _canvas(cfg, n_frames)
        gx, gy = (int(v) for v in rng.integers(cells, size=2) * cfg.cell)
        _draw(px, gx, gy, cfg.cell, COLOURS[colour_names[int(rng.integers(4))]])
        box = [gx, gy, gx + cfg.cell, gy + cfg.cell]
        return px, (f"Where is the square at second {t}? Give its box [x1, y1, x2, y2] in pixels "
                    f"of the {cfg.size}x{cfg.size} frame."), json.dumps(box), "spatial grounding", \
            f"row {gy // cfg.cell} column {gx // cfg.cell}", None
    if task == "flash":
        px = _canvas(cfg, cfg.fps * FLASH_SECONDS)
        window = int(rng.integers(FLASH_SECONDS))
        first = window * cfg.fps + int(rng.integers(cfg.fps - FLASH_FRAMES + 1))
        c = int(rng.integers(4))
        gx, gy = rng.integers(cells, size=2) * cfg.cell
        _draw(px[first:first + FLASH_FRAMES], int(gx), int(gy), cfg.cell, COLOURS[colour_names[c]])
        options = [f"{LETTERS[i]}. {name}" for i, name in enumerate(colour_names)]
        # One number in the question (the window's start), so copying it into the call is a plain
        # lookup of the prompt's only digit. Worded "between second w and second w+1" the tiny
        # model must tell two digits apart ~50 tokens back (likely hard for 2 layers with rotary
        # base 10, whose longest wavelength is ~54 tokens): supervised on the call alone it stayed
        # at chance on the start through step 800 of 16, and learnt this wording's start by step
        # 650 (1.00 held-out; scripts/flash_call_probe.py).
        return px, (f"A square flashes briefly in the one-second window that starts at second {window}. "
                    "What colour is it?"), LETTERS[c], "multiple choice", colour_names[c], options
    raise ValueError(f"unknown synthetic task {task!r}; known: {', '.join(TASKS + OPT_IN_TASKS)}")


def write_suite(out_dir: str | Path, num_train: int = 256, num_val: int = 64, seed: int = 0,
                tasks: tuple[str, ...] = TASKS, cfg: SynthConfig = SynthConfig(),
                train_mix: tuple[str, ...] | None = None) -> dict[str, Path]:
    """Write videos, images, train.jsonl and val.jsonl under `out_dir`; return the two paths.

    Tasks cycle in order so every split holds each task in equal share (the training split
    cycles `train_mix` instead when given: a task named twice gets twice the share); the
    content of each sample is drawn from one generator seeded by `seed`. A suite that holds a
    task of `TASK_TOOLS` writes each row's `tools`.
    """
    from PIL import Image

    out = Path(out_dir)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_sample_tools = any(t in TASK_TOOLS for t in tasks + (train_mix or ()))
    paths = {}
    for split, n in (("train", num_train), ("val", num_val)):
        rows = []
        cycle = train_mix if split == "train" and train_mix else tasks
        for i in range(n):
            task = cycle[i % len(cycle)]
            pid = f"{split}-{i:05d}-{task}"
            px, problem, answer, ptype, thought, options = _make_task(task, rng, cfg)
            if px.shape[0] == 1:
                media = f"images/{pid}.png"
                Image.fromarray(px[0]).save(out / media)
                data_type = "image"
            else:
                media = f"videos/{pid}.mp4"
                # Key frames only: x264's motion search made 3-5 in 150 clips differ from run to
                # run (the same frames, other bytes, decoded pixels off by up to 34), and with
                # them the whole training run; intra-only clips are byte-identical for a seed.
                write_video(out / media, px, fps=cfg.fps, gop=1)
                data_type = "video"
            rows.append(_record(pid, task, problem, answer, ptype, thought, data_type, media, options))
            if task == "flash":  # the correct trajectory looks again at the stated window first
                window = int(FLASH_WINDOW_RE.search(problem).group(1))
                rows[-1]["offline_output"] = flash_call(window) + rows[-1]["offline_output"]
            if per_sample_tools:
                rows[-1]["tools"] = TASK_TOOLS.get(task, [])
        paths[split] = out / f"{split}.jsonl"
        with open(paths[split], "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return paths
