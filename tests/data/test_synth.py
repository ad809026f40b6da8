"""The synthetic suite: deterministic, balanced, and every answer readable from the pixels."""

import json
from collections import defaultdict

import av
import numpy as np
import pytest
from PIL import Image

from easyvideor1.data.loading import load_samples
from easyvideor1.data.synth import COLOURS, DEMO_TRAIN_MIX, DIRECTIONS, LETTERS, TASKS, SynthConfig, write_suite


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    write_suite(out, num_train=48, num_val=16, seed=3)
    return out


def _pixels(sample):
    if sample.data_type == "image":
        return np.asarray(Image.open(sample.images[0]).convert("RGB"))[None]
    with av.open(sample.videos[0]) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def _squares(frame, cell=SynthConfig().cell):
    """Colour name of each occupied grid cell, read from the cell's centre pixel."""
    found = []
    for gy in range(frame.shape[0] // cell):
        for gx in range(frame.shape[1] // cell):
            rgb = frame[gy * cell + cell // 2, gx * cell + cell // 2].astype(int)
            if rgb.sum() > 150:
                found.append((gx, gy, min(COLOURS, key=lambda c: np.abs(rgb - COLOURS[c]).sum())))
    return found


def _solve(sample):
    """A hand-written solver that only looks at pixels (proves the answer is in them)."""
    px = _pixels(sample)
    task = sample.extra["task"]
    lit = [t for t in range(len(px)) if px[t].max() > 100]
    if task in ("colour", "image_colour"):
        return LETTERS[list(COLOURS).index(_squares(px[0])[0][2])]
    if task in ("count", "image_count"):
        return str(len(_squares(px[0])))
    if task == "presence":
        return "yes" if lit else "no"
    if task == "when":
        fps = 8
        return json.dumps([lit[0] // fps, (lit[-1] + 1) // fps])
    if task == "where":
        ys, xs = np.nonzero(px[0].max(-1) > 100)
        return json.dumps([int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1])
    if task == "motion":
        def centre(f):
            ys, xs = np.nonzero(f.max(-1) > 100)
            return xs.mean(), ys.mean()
        (x0, y0), (x1, y1) = centre(px[0]), centre(px[-1])
        dx, dy = x1 - x0, y1 - y0
        move = (np.sign(dx), 0) if abs(dx) > abs(dy) else (0, np.sign(dy))
        return LETTERS[[v for v in DIRECTIONS.values()].index(tuple(int(m) for m in move))]
    raise AssertionError(task)


def test_every_answer_is_readable_from_the_pixels(suite):
    for split in ("train", "val"):
        for s in load_samples(suite / f"{split}.jsonl"):
            assert _solve(s) == s.answer, s.problem_id


def test_questions_do_not_leak_answers(suite):
    texts, by_task = defaultdict(set), defaultdict(list)
    for s in load_samples(suite / "train.jsonl"):
        texts[s.extra["task"]].add((s.problem, tuple(s.options or ())))
        by_task[s.extra["task"]].append(s)
    assert set(by_task) == set(TASKS) and len({len(v) for v in by_task.values()}) == 1  # balanced
    for task in ("colour", "motion", "count", "presence", "when", "image_colour", "image_count"):
        assert len(texts[task]) == 1, task  # one fixed text: it carries no information
        assert len({s.answer for s in by_task[task]}) > 1, task
    for s in by_task["where"]:  # the text names a second and the frame size, never the box
        assert s.problem.split("?")[1] == by_task["where"][0].problem.split("?")[1]


def test_offline_outputs_carry_the_answer(suite):
    for s in load_samples(suite / "train.jsonl"):
        assert s.has_offline_trajectory
        assert s.offline_output.endswith(f"<answer>{s.answer}</answer>")
        assert s.offline_output.startswith("<think>")


def test_deterministic_by_seed(tmp_path):
    a = write_suite(tmp_path / "a", num_train=8, num_val=2, seed=5)
    b = write_suite(tmp_path / "b", num_train=8, num_val=2, seed=5)
    c = write_suite(tmp_path / "c", num_train=8, num_val=2, seed=6)
    assert a["train"].read_text() == b["train"].read_text()
    assert a["train"].read_text() != c["train"].read_text()
    for sa, sb in zip(load_samples(a["train"]), load_samples(b["train"])):
        assert np.array_equal(_pixels(sa), _pixels(sb))
        media = (sa.videos or sa.images)[0], (sb.videos or sb.images)[0]
        assert open(media[0], "rb").read() == open(media[1], "rb").read(), sa.problem_id  # the same bytes


def test_offline_outputs_score_full_marks(suite):
    from easyvideor1.rewards import score

    for s in load_samples(suite / "train.jsonl"):
        result = score(s.offline_output, s)
        assert (result.accuracy, result.format, result.overall) == (1.0, 1.0, 1.0), s.problem_id


def test_training_mix_sets_the_shares_of_the_training_split_only(tmp_path):
    paths = write_suite(tmp_path, num_train=20, num_val=16, seed=1, train_mix=DEMO_TRAIN_MIX)
    train = [s.extra["task"] for s in load_samples(paths["train"])]
    val = [s.extra["task"] for s in load_samples(paths["val"])]
    assert train.count("motion") == 6 and all(train.count(t) == 2 for t in TASKS if t != "motion")
    assert all(val.count(t) == 2 for t in TASKS)  # held-out: an equal share per task
    for s in load_samples(paths["train"]):
        assert _solve(s) == s.answer, s.problem_id


def test_flash_shows_its_colour_only_for_a_moment_inside_the_stated_window(tmp_path):
    """The opt-in `flash` task: an 8-s clip, a square of the answer's colour on FLASH_FRAMES
    consecutive frames, all inside the 1-s window the question states; nothing on the others."""
    import re

    import numpy as np

    from easyvideor1.data.synth import FLASH_FRAMES, FLASH_SECONDS, _make_task

    cfg = SynthConfig()
    rng = np.random.default_rng(0)
    for _ in range(8):
        px, problem, answer, ptype, thought, options = _make_task("flash", rng, cfg)
        window = int(re.search(r"one-second window that starts at second (\d+)\.", problem).group(1))
        assert re.findall(r"\d+", problem) == [str(window)]  # one number to copy into the call
        lit = [t for t in range(len(px)) if px[t].any()]
        assert len(px) == FLASH_SECONDS * cfg.fps and len(lit) == FLASH_FRAMES
        assert lit == list(range(lit[0], lit[0] + FLASH_FRAMES))
        assert window * cfg.fps <= lit[0] and lit[-1] < (window + 1) * cfg.fps
        colour = px[lit[0]].reshape(-1, 3).max(0)
        assert tuple(colour) == COLOURS[thought] and options[LETTERS.index(answer)].endswith(thought)
        assert ptype == "multiple choice"
    paths = write_suite(tmp_path, num_train=2, num_val=1, tasks=("flash",))
    for line in paths["train"].read_text().splitlines():  # the offline trajectory calls crop_video on the window
        row = json.loads(line)
        window = int(re.search(r"starts at second (\d+)", row["problem"]).group(1))
        call = json.loads(re.search(r"<tool_call>(.*)</tool_call>", row["offline_output"], re.S).group(1))
        assert row["task"] == "flash" and call == {"name": "crop_video", "arguments": {"start": window,
                                                                                      "end": window + 1}}
        assert re.fullmatch(r"<tool_call>.*</tool_call><think>\w+</think><answer>[A-D]</answer>", row["offline_output"],
                            re.S)


def test_only_flash_rows_are_offered_a_tool(suite, tmp_path):
    """`demo --tools`' suite (flash beside other tasks): flash rows list crop_video, every other
    row lists no tool, so only flash prompts carry the tools' system text; a suite without flash
    writes no `tools` field (the plain demo's files are unchanged)."""
    paths = write_suite(tmp_path, num_train=3, num_val=3, tasks=("colour", "image_count", "flash"),
                        train_mix=("colour", "flash", "flash"))
    for split in ("train", "val"):
        rows = [json.loads(line) for line in paths[split].read_text().splitlines()]
        assert {r["task"]: r["tools"] for r in rows} == (
            {"colour": [], "flash": ["crop_video"]} if split == "train"
            else {"colour": [], "image_count": [], "flash": ["crop_video"]})
    for split in ("train", "val"):
        assert not any("tools" in json.loads(line) for line in (suite / f"{split}.jsonl").read_text().splitlines())
