"""Building the cache: reports, dedupe, re-runs, the `cache` command, and SIGKILL mid-run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
from vision_media import moving_bar

from easyvideor1.records import Sample
from easyvideor1.vision.cache import FrameSource, read_entry
from easyvideor1.vision import cache_build
from easyvideor1.vision.cache_build import build_cache
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.encode import write_video
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from chaos import wait_until_dead  # noqa: E402

CFG = VisionConfig(min_frames=4, max_frames=8, fps=3.0, video_max_pixels=56 * 56 * 4, video_min_pixels=56 * 56,
                   image_max_pixels=28 * 28 * 16)
REPO = Path(__file__).resolve().parents[2]


def _read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "entries").glob("*/*.safetensors"))


def test_report_dedupe_and_rerun(media_dir, broken_videos, tmp_path):
    good = [Sample(f"q{i}", "A", "multiple choice", "video", videos=[str(media_dir / "h264.mp4")], problem_id=f"dup{i}")
            for i in range(3)]
    good.append(Sample("q", "A", "multiple choice", "image", images=[str(media_dir / "rgb.png")], problem_id="img"))
    good.append(Sample("q", "4", "numerical", "text", problem_id="txt"))
    bad = [Sample("q", "A", "multiple choice", "video", videos=[str(media_dir / name)], problem_id=f"bad-{name}")
           for name in broken_videos]
    bad.append(Sample("q", "A", "multiple choice", "image", images=[str(media_dir / "text.png")], problem_id="badimg"))
    out = tmp_path / "cache"
    report = build_cache(good + bad, CFG, out, workers=2, progress=False)
    assert (report.samples, report.ok_samples, report.failed_samples) == (len(good) + len(bad), len(good), len(bad))
    # h264.mp4 named three times: one job, two shared references
    assert report.duplicates == 2 and report.built == 2 and report.skipped == 0
    manifest, failures = _read_jsonl(report.manifest), _read_jsonl(report.failures)
    assert [m["problem_id"] for m in manifest] == [s.problem_id for s in good]
    assert len({m["cache_keys"]["videos"][0] for m in manifest[:3]}) == 1
    assert manifest[3]["cache_keys"] == {"videos": [], "images": [manifest[3]["cache_keys"]["images"][0]]}
    assert manifest[4]["cache_keys"] == {"videos": [], "images": []} and manifest[4]["problem"] == "q"
    got = {f["problem_id"]: f["reason"] for f in failures}
    assert got == {**{f"bad-{n}": r for n, r in broken_videos.items()}, "badimg": "not_an_image"}
    assert all(f["file"].startswith(str(media_dir)) and f["sample"]["problem_id"] == f["problem_id"]
               for f in failures)
    assert not list((out / "entries").glob("*/*.tmp*"))
    again = build_cache(good + bad, CFG, out, workers=2, progress=False)
    assert (again.built, again.skipped, again.ok_samples) == (0, 2, len(good))


def _cache_command(*args: str) -> list[str]:
    """The `cache` subcommand through the real CLI."""
    return [sys.executable, "-m", "easyvideor1.cli", "cache", *args]


TIMEOUT_S = 600  # ends a hang; the cache commands here take seconds, even on 2 busy cores


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO)}


def test_cache_command_reports_bad_records_and_files(media_dir, tmp_path):
    rows = [
        {"problem": "<video> what moves?", "answer": "A", "problem_type": "multiple choice", "videos": ["h264.mp4"],
         "problem_id": "ok"},
        {"problem": "where", "answer": "B", "problem_type": "multiple choice", "videos": ["absent.mp4"],
         "problem_id": "gone"},
        {"problem": "no answer", "problem_type": "numerical", "problem_id": "noanswer"},
        {"problem": "2+2", "answer": "4", "problem_type": "numerical", "problem_id": "text"},
    ]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cache"
    proc = forkserver.run(_cache_command("--data", str(data), "--out", str(out), "--data-root", str(media_dir),
                                         "--workers", "1", "--fps", "3", "--video-max-frames", "8",
                                         "--video-max-pixels", str(56 * 56 * 4), "--video-min-pixels", str(56 * 56),
                                         "--no-progress"),
                          capture_output=True, text=True, env=_env(), timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "2/4 samples cached" in proc.stdout
    assert [m["problem_id"] for m in _read_jsonl(out / "manifest.jsonl")] == ["ok", "text"]
    failures = {f["problem_id"]: f for f in _read_jsonl(out / "failures.jsonl")}
    assert failures["gone"]["reason"] == "missing" and failures["gone"]["file"].endswith("absent.mp4")
    assert failures["noanswer"]["reason"] == "bad_record" and "answer" in failures["noanswer"]["detail"]
    config = json.loads((out / "cache_config.json").read_text())
    assert config["params"]["fps"] == 3.0 and config["params"]["max_frames"] == 8


def test_sigkill_mid_build_leaves_only_valid_entries(tmp_path):
    videos = []
    for i in range(3):  # 10 s each; 8 clip segments per video = 24 distinct entries
        path = tmp_path / "media" / f"long{i}.mp4"
        write_video(path, moving_bar(300, 144, 192, seed=i), 30.0)
        videos.append(path)
    data = tmp_path / "data.jsonl"
    rows = [{"problem": "q", "answer": "1", "problem_type": "numerical", "videos": [str(video)],
             "video_start": k, "video_end": k + 2.5, "problem_id": f"{i}-{k}"}
            for i, video in enumerate(videos) for k in range(8)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cache"
    args = _cache_command("--data", str(data), "--out", str(out), "--workers", "2", "--fps", "4",
                          "--video-max-frames", "8", "--no-progress")
    proc = forkserver.Popen(args, env=_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + TIMEOUT_S
    while not _entries(out) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)  # the command and its workers, wherever they are
    proc.wait()
    wait_until_dead(proc.pid)  # the workers too, not only the leader that wait() reaped
    survivors = _entries(out)
    assert 1 <= len(survivors) < 24, "the kill should land mid-run"
    assert not (out / "manifest.jsonl").exists()
    cfg = VisionConfig(fps=4.0, max_frames=8)
    realtime = FrameSource(cfg, None, "realtime")
    for entry in survivors:  # whatever survived is complete and correct
        frames, header = read_entry(entry, cfg.key_params())
        want = realtime.video(header["source"]["path"], header["start"], header["end"])
        assert torch.equal(frames.pixels, want.pixels) and frames.metadata == want.metadata
    rerun = forkserver.run(args, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert rerun.returncode == 0, rerun.stderr
    assert len(_entries(out)) == 24 and not list((out / "entries").glob("*/*.tmp*"))
    assert f"{len(survivors)} already cached" in rerun.stdout
    source = FrameSource(cfg, out, "cache_only")
    for row in _read_jsonl(out / "manifest.jsonl")[::5]:
        sample = Sample(row["problem"], row["answer"], row["problem_type"], "video", videos=row["videos"],
                        video_start=row["video_start"], video_end=row["video_end"])
        assert torch.equal(source.frames_for_sample(sample)[0].pixels,
                           realtime.frames_for_sample(sample)[0].pixels)


def test_a_temporary_file_of_a_zombie_writer_is_stale(tmp_path):
    """A killed worker stays a zombie until its new parent reaps it; it writes nothing more, so a
    rerun clears its temporary file instead of keeping it (a fast rerun met one)."""
    (tmp_path / "entries" / "ab").mkdir(parents=True)
    writer = subprocess.Popen([sys.executable, "-c", "pass"])  # not reaped below until the end: a zombie
    deadline = time.monotonic() + TIMEOUT_S
    while Path(f"/proc/{writer.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    host = socket.gethostname()
    stale = tmp_path / "entries" / "ab" / f"x.safetensors.tmp{writer.pid}@{host}"
    live = tmp_path / "entries" / "ab" / f"y.safetensors.tmp{os.getpid()}@{host}"
    stale.write_bytes(b"partial")
    live.write_bytes(b"partial")
    cache_build._clear_stale_tmp(tmp_path)
    writer.wait()
    assert not stale.exists() and live.exists()


HELD_STATE_BUILD = r'''
import json, os, sys, threading
import torch
import torch.distributed as dist
from easyvideor1.records import Sample
from easyvideor1.vision.cache_build import build_cache
from easyvideor1.vision.config import VisionConfig

if __name__ == "__main__":
    media, out, names = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    # what a notebook holds after training in process: a live gloo group and a busy intra-op pool
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.all_reduce(torch.ones(4))
    # and a group that is garbage, not yet collected (a cycle), as a test's or a notebook's
    # dropped group is: a child forked from this process would collect it, running its destructor
    # without its threads (the collection made certain in any child this process forks)
    import datetime
    dropped = [dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=60))]
    dropped.append(dropped)
    dropped[0].allreduce([torch.ones(4)]).wait()
    import gc
    gc.collect()
    gc.disable()  # no collection here before the build: the dropped group stays garbage
    del dropped
    os.register_at_fork(after_in_child=gc.collect)
    torch.set_num_threads(2)
    stop = threading.Event()

    def busy():
        a = torch.randn(256, 256)
        while not stop.is_set():
            a @ a

    spinner = threading.Thread(target=busy, daemon=True)
    spinner.start()
    cfg = VisionConfig(min_frames=4, max_frames=8, fps=3.0, video_max_pixels=56 * 56 * 4, video_min_pixels=56 * 56,
                       image_max_pixels=28 * 28 * 16)
    samples = [Sample("q", "A", "multiple choice", "video", videos=[f"{media}/{n}"], problem_id=n) for n in names]
    samples.append(Sample("q", "A", "multiple choice", "image", images=[f"{media}/text.png"], problem_id="text.png"))
    samples.append(Sample("q", "A", "multiple choice", "video", videos=[f"{media}/h264.mp4"], problem_id="good"))
    report = build_cache(samples, cfg, out, workers=2, progress=False)
    stop.set()
    rows = [json.loads(line) for line in open(report.failures)]
    print(json.dumps({"ok": report.ok_samples, "reasons": {r["problem_id"]: r["reason"] for r in rows}}))
    dist.destroy_process_group()
'''


def test_build_from_a_process_holding_a_gloo_group_and_busy_threads(media_dir, broken_videos, tmp_path):
    """Failure 2 of issue 54: the builder's workers once forked from the building process, so a
    worker inherited a live gloo group (and torch's thread pool) without their threads, and the
    group's destructor crashed the worker (`'error'` instead of the file's reason). Built from a
    process that holds both, every file still gets its own reason."""
    script = tmp_path / "build_holding_state.py"
    script.write_text(HELD_STATE_BUILD)
    proc = subprocess.run([sys.executable, str(script), str(media_dir), str(tmp_path / "cache"),
                           json.dumps(list(broken_videos))], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"ok": 1, "reasons": {**broken_videos, "text.png": "not_an_image"}}, proc.stderr[-3000:]
