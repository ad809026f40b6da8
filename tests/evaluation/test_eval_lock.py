"""Two evaluations writing one results folder: the second is refused with a message naming the
folder and the running one (not interleaved); once the first is SIGKILLed (its lock dies with
it, the lock file stays), a new run takes the folder over and finishes with each sample once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

TIMEOUT_S = 900  # ends a hang; each run takes seconds


def eval_process(model, data, out, hook=""):
    """The evaluator in a subprocess, reporting a UserError the way the CLI does (status 2)."""
    code = f"""
import sys
from easyvideor1.errors import UserError
from easyvideor1.evaluation.evaluator import Evaluator, EvalOptions
from easyvideor1.evaluation.settings import DecodingSettings
from easyvideor1.vision.config import VisionConfig
vision = VisionConfig(family="qwen2_5_vl", max_frames=4, video_min_pixels=3136, video_max_pixels=3136,
                      image_min_pixels=3136, image_max_pixels=3136)
ev = Evaluator({str(model)!r}, engine="hf", preset="qwen2_5_vl_greedy",
               options=EvalOptions(out_dir={str(out)!r}, cache_mode="realtime", dtype="float32",
                                   asynchronous=False, max_batch=2, load_workers=1),
               sampling=DecodingSettings(temperature=0, max_new_tokens=8), vision=vision)
try:
    ev.run([{str(data)!r}])
except UserError as e:
    print(f"error: {{e}}", file=sys.stderr)
    sys.exit(2)
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EASYVIDEOR1_TEST_HOOK": hook}
    return forkserver.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)


def test_second_eval_is_refused_and_a_killed_one_leaves_no_lock(tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "data", num_train=0, num_val=4, seed=1)["val"]
    out = tmp_path / "results"
    first = eval_process(model, data, out, hook="results.flush:1:sleep=600")  # holds the folder
    rows = out / "file-val.jsonl"
    deadline = time.monotonic() + TIMEOUT_S
    while not rows.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, first.stdout.read()
    second = eval_process(model, data, out)
    text = second.communicate(timeout=TIMEOUT_S)[0]
    assert second.returncode == 2, text
    assert f"{out} is in use by another eval (pid {first.pid}" in text and "another --out" in text
    assert "Traceback" not in text
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (out / ".eval.lock").exists()  # the file stays; its lock died with the process
    third = eval_process(model, data, out)
    assert third.wait(timeout=TIMEOUT_S) == 0, third.stdout.read()
    ids = [json.loads(line)["id"] for line in Path(rows).read_text().splitlines()]
    assert len(ids) == 4 and len(set(ids)) == 4
