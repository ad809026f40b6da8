"""Writes on a nearly full filesystem: cache build, checkpoint and results rows. Each fails
with an error naming the path, leaves nothing half written (no temporary entry, checkpoint
folder or partial row), and succeeds once space is freed.

The filesystem is a real one: a small tmpfs mounted for the test (needs root, as on this
project's machines; skipped otherwise), filled by a file that leaves a few KiB free.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from easyvideor1.errors import OutOfSpace
from easyvideor1.evaluation.results import ResultRow, ResultStore
from easyvideor1.training.state import checkpoint as ckpt
from easyvideor1.vision.encode import write_video
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

sys.path.insert(0, str(Path(__file__).resolve().parent / "vision"))
from test_cache_build import _cache_command, _env  # noqa: E402
from vision_media import moving_bar  # noqa: E402


@pytest.fixture
def small_fs(tmp_path):
    """(mount point, fill(leave_bytes), free()) on a 2 MiB tmpfs."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root to mount a 2 MiB tmpfs (uid {os.geteuid()}): the disk-full checks did not run")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if mount.returncode:  # e.g. a container without CAP_SYS_ADMIN
        why = (mount.stderr.strip() or f"exit status {mount.returncode}").splitlines()[0].rstrip(".")
        pytest.skip(f"cannot mount a 2 MiB tmpfs ({why}): needs CAP_SYS_ADMIN; the disk-full checks did not run")
    filler = mnt / "filler"

    def fill(leave: int) -> None:
        st = os.statvfs(mnt)
        with open(filler, "ab") as f:
            f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))

    try:
        yield mnt, fill, lambda: filler.unlink()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_cache_build_on_a_full_disk(small_fs, tmp_path):
    mnt, fill, free = small_fs
    rows = []
    for i in range(3):
        video = tmp_path / f"v{i}.mp4"
        write_video(video, moving_bar(12, 56, 56, seed=i), 6.0)
        rows.append({"problem": "<video> q", "answer": "1", "problem_type": "numerical", "videos": [str(video)],
                     "problem_id": f"s{i}"})
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = mnt / "cache"
    args = _cache_command("--data", str(data), "--out", str(out), "--workers", "0", "--fps", "2",
                          "--video-max-frames", "4", "--video-max-pixels", "3136", "--video-min-pixels", "784",
                          "--no-progress")
    out.mkdir()
    fill(leave=8 * 1024)  # less than one entry (4 frames of 56x56x3 and more)
    proc = forkserver.run(args, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no space left on the device writing" in proc.stderr and str(out) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(out.rglob("*.tmp*")) and not (out / "manifest.jsonl").exists()
    free()
    again = forkserver.run(args, env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3/3 samples cached" in again.stdout
    verify = forkserver.run([*args, "--verify"], env=_env(), capture_output=True, text=True, timeout=600)
    assert " 0 rebuilt" in verify.stdout


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 64)).sum().backward()
    opt.step()
    return model, opt


def test_checkpoint_on_a_full_disk(small_fs):
    mnt, fill, free = small_fs
    model, opt = _model_and_optimizer()
    root = mnt / "ckpts"
    ckpt.save_checkpoint(root, 1, model, opt, None, {"step": 1})
    fill(leave=16 * 1024)  # the weights alone are 33 KB
    with pytest.raises(OutOfSpace, match="no space left on the device writing .*step-000002.tmp-"):
        ckpt.save_checkpoint(root, 2, model, opt, None, {"step": 2})
    assert sorted(p.name for p in root.iterdir()) == ["step-000001"]  # no half checkpoint
    assert ckpt.load_checkpoint(ckpt.resolve_resume(root, "auto"), model, opt, None) == {"step": 1}
    free()
    ckpt.save_checkpoint(root, 2, model, opt, None, {"step": 2})
    assert ckpt.load_checkpoint(ckpt.resolve_resume(root, "auto"), model, opt, None) == {"step": 2}


def test_results_rows_on_a_full_disk(small_fs):
    mnt, fill, free = small_fs
    rows = [ResultRow(id=f"s{i}", status="ok", score=1.0, response="x" * 3000) for i in range(6)]
    with ResultStore.open(mnt / "results", "bench") as store:
        store.append(rows[0])
        fill(leave=5 * 1024)  # about one more row
        with pytest.raises(OutOfSpace, match="no space left on the device writing .*bench.jsonl"):
            for row in rows[1:]:
                store.append(row)
    written = ResultStore(mnt / "results" / "bench.jsonl").rows()  # whole rows only
    assert 1 <= len(written) < 6 and (mnt / "results" / "bench.jsonl").read_bytes().endswith(b"\n")
    free()
    with ResultStore.open(mnt / "results", "bench") as store:
        for row in store.pending([type("S", (), {"problem_id": r.id})() for r in rows]):
            store.append(next(r for r in rows if r.id == row.problem_id))
    assert [r.id for r in ResultStore(mnt / "results" / "bench.jsonl").rows()] == [r.id for r in rows]
