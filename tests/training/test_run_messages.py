"""What a training run tells its user, in a real 2-step run of a tiny model with the progress bar
on: fewer samples than a step's batch is said once at start with the real field names; a sample
whose video is missing is said once per run (not once per step), names training's setting
`data.data_root` (not the commands' `--data-root`), and is printed above the progress bar, not
into it; the bar's postfix gives seconds per step as `s/step`."""

import contextlib
import json
import logging
import re
import sys

from test_distributed import write_config

from easyvideor1.config import load_config
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train


@contextlib.contextmanager
def console():
    """A console log handler on the root logger, as `easyvideor1 train` sets (logging.basicConfig);
    made in the test, where sys.stderr is capsys's."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root, level = logging.getLogger(), logging.getLogger().level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_small_data_missing_video_and_progress_postfix(tmp_path, capsys):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    rows = [{"problem_id": f"t{i}", "problem": f"{i}+1?", "answer": str(i + 1), "problem_type": "numerical"}
            for i in range(2)]
    rows.append({"problem_id": "my-4", "problem": "How many squares?", "answer": "2", "problem_type": "numerical",
                 "videos": ["gone.mp4"]})
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # 3 samples, 4 a step: every step holds the sample with the missing video at least once
    path = write_config(tmp_path, model, data, tmp_path / "out", steps=2, logging__progress=True,
                        hybrid={"enable": False})
    with console():
        # 1 of 4 skipped: over the default data.max_skip_fraction (tests/data/test_skipped_samples.py)
        run = build_run(load_config(str(path), ["checkpoint.export_hf=false", "data.max_skip_fraction=1"]))
        train(run)
    assert all(r["data/prompt_failures"] >= 1 for r in run.history)  # failed in both steps
    err = capsys.readouterr().err
    assert err.count("data.train_files has 3 samples, fewer than training.rollout_batch_size 4: "
                     "each step reuses samples") == 1, err
    skipped = [line for line in err.split("\n") if "sample my-4 skipped" in line]
    assert len(skipped) == 1, err
    assert "data.data_root" in skipped[0] and "--data-root" not in skipped[0], skipped[0]
    # through the bar (tqdm.write): the line holds the message alone, not a bar then the message
    assert skipped[0].split("\r")[-1].startswith("WARNING easyvideor1.prompts: sample my-4 skipped"), repr(skipped[0])
    # the bar's postfix, after tqdm's own rate: "[00:00<00:00,  4.6step/s, reward=0  accuracy=0  0.237s/step]"
    postfix = [p for p in re.findall(r"train: [^\r\n]*?\d/2 \[([^\]]*)\]", err) if "reward=" in p]
    assert postfix and all(re.search(r"  \d+(\.\d+)?s/step$", p) and "step=" not in p for p in postfix), postfix
    assert "skipped=1 (25.0%)" in postfix[0] and "skipped=2 (25.0%)" in postfix[-1], postfix  # the run's count
