"""Building the frame cache: `build_cache(samples, cfg, out_dir, workers)`.

Each distinct (media file, parameters) pair is one job, decoded once however many samples
name it; jobs run in worker processes (one FFmpeg/torch thread each) behind a tqdm bar.
Finished entries are skipped on re-runs; `verify=True` loads every existing entry in full and
rebuilds the ones that are damaged. Every sample ends up either in `manifest.jsonl` (the
sample plus its cache keys) or in `failures.jsonl` (the sample, the file, the reason).

Several builders may run into one folder at once (one per node on a shared filesystem):
entries are written under unique temporary names and renamed, and the folder's config,
manifest, failures and index are written under a lock (`locks.FolderLock`), each merged with
what is there, so every sample of every builder is listed once (a sample built again replaces
its row) and the index holds every builder's entries.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from easyvideor1 import testhooks
from easyvideor1.errors import OutOfSpace, out_of_space
from easyvideor1.locks import FolderLock
from easyvideor1.records import Sample
from easyvideor1.vision.cache import (
    CONFIG_FILE,
    FORMAT_VERSION,
    INDEX_FILE,
    CacheError,
    check_cache_config,
    entry_key,
    entry_path,
    index_name,
    read_entry,
    source_identity,
    write_entry,
)
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.decode import MediaError, decode_image, decode_video

MANIFEST_FILE = "manifest.jsonl"
FAILURES_FILE = "failures.jsonl"


@dataclass(frozen=True)
class Job:
    """One cache entry to make: a media file, its clip bounds and its key."""

    kind: str  # video | image
    path: str
    start: float | None
    end: float | None
    key: str
    source: dict[str, Any]  # the source identity the key was computed from


@dataclass
class BuildOutcome:
    """What became of one job."""

    key: str
    ok: bool
    reason: str = ""  # MediaError reason code, or "error" for anything unexpected
    detail: str = ""
    bytes: int = 0


@dataclass
class CacheReport:
    """Summary of one `build_cache` run."""

    samples: int = 0  # samples given (plus bad records passed in as failures)
    ok_samples: int = 0  # samples in the manifest
    failed_samples: int = 0  # samples in the failure report
    jobs: int = 0  # distinct (media, parameters) pairs
    duplicates: int = 0  # media references served by another sample's job
    built: int = 0  # entries written this run
    skipped: int = 0  # entries already there
    rebuilt: int = 0  # damaged entries found by verify and written again
    failed_jobs: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    manifest: str = ""
    failures: str = ""
    failure_reasons: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """A few human lines for the end of the `cache` command."""
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.failure_reasons.items())) or "none"
        return (f"{self.ok_samples}/{self.samples} samples cached ({self.failed_samples} failed: {reasons})\n"
                f"{self.jobs} distinct media ({self.duplicates} shared references): {self.built} built, "
                f"{self.skipped} already cached, {self.rebuilt} rebuilt after verify, {self.failed_jobs} failed; "
                f"{self.bytes_written / 1e6:.1f} MB written in {self.seconds:.1f}s\n"
                f"manifest: {self.manifest}\nfailures: {self.failures}")


def _media(sample: Sample) -> list[tuple[str, str, float | None, float | None]]:
    return ([("video", v, sample.video_start, sample.video_end) for v in sample.videos]
            + [("image", i, None, None) for i in sample.images])


def _run_job(job: Job, cfg: VisionConfig, out_dir: str, verify: bool) -> BuildOutcome:
    """Make (or, with verify, check) one entry; runs in a worker process."""
    path = entry_path(out_dir, job.key)
    if path.exists():
        if not verify:
            return BuildOutcome(job.key, True, reason="skipped")
        try:
            frames, _ = read_entry(path, cfg.key_params())
            frames.pixels.sum()  # touch every byte: a truncated file fails here
            return BuildOutcome(job.key, True, reason="skipped")
        except CacheError:
            path.unlink(missing_ok=True)
            rebuilt = True
    else:
        rebuilt = False
    try:
        if job.kind == "video":
            frames = decode_video(job.path, cfg, job.start, job.end)
        else:
            frames = decode_image(job.path, cfg)
        header = {"format_version": FORMAT_VERSION, "key": job.key, "kind": job.kind,
                  "source": job.source,
                  "params": cfg.key_params(), "start": job.start, "end": job.end}
        size = write_entry(path, frames, header)
    except OutOfSpace:
        raise  # not this file's fault: the whole build stops, naming the path
    except MediaError as e:
        return BuildOutcome(job.key, False, e.reason, str(e))
    except Exception as e:  # noqa: BLE001 - reported per file, the run goes on
        return BuildOutcome(job.key, False, "error", f"{job.kind} {job.path}: {type(e).__name__}: {e}")
    return BuildOutcome(job.key, True, reason="rebuilt" if rebuilt else "built", bytes=size)


def _init_worker(environ: dict[str, str]) -> None:
    import torch

    os.environ.clear()  # the builder's environment now, not the fork server's from its start
    os.environ.update(environ)
    torch.set_num_threads(1)  # one process per core: threads inside would only contend
    _die_with_parent()


def _pool_context() -> multiprocessing.context.BaseContext:
    """How the workers start: from a fork server where there is one (Linux, macOS), else spawned.

    Never a plain fork of the building process: that process may hold threads (torch's intra-op
    pool, a trainer's gloo process group, a notebook's event loop) that a forked child inherits as
    memory without the threads; a gloo group's destructor in the child then joins threads that do
    not exist and crashes it (a segfault in `~ProcessGroupGloo`). The fork server is a fresh
    interpreter started once per building process, single-threaded, that has imported this module
    (torch and the decoders) and forks each worker from itself. As with any multiprocessing start
    other than fork, a script that builds a cache with workers keeps its top-level code under
    `if __name__ == "__main__":` (the workers import the script).
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        return ctx
    return multiprocessing.get_context("spawn")


def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker when the building process dies (a SIGKILLed
    build must not leave orphans writing entries behind the next run's back)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _prepare_dir(out_dir: Path, cfg: VisionConfig, content_hash: bool) -> None:
    """Create the cache dir or check that it was built with `cfg`; clear stale temporary files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stored = check_cache_config(out_dir, cfg)
    if stored is not None and bool(stored.get("content_hash")) != content_hash:
        raise CacheError(f"cache {out_dir} was built with content_hash={stored.get('content_hash')}; "
                         "use the same setting or another --out")
    if stored is None:
        _write_json(out_dir / CONFIG_FILE, {"format_version": FORMAT_VERSION, "params": cfg.key_params(),
                                            "content_hash": content_hash})
    _clear_stale_tmp(out_dir)


STALE_REMOTE_TMP_S = 3600  # a temporary entry of another host older than this is a dead writer's


def _clear_stale_tmp(out_dir: Path) -> None:
    """Remove temporary entry files whose writer is gone (a killed run). Names are
    `<entry>.tmp<pid>@<host>`: this host's are checked by pid; another host's (a builder on
    another node of a shared filesystem) only once they are an hour old."""
    here = socket.gethostname()
    for tmp in (out_dir / "entries").glob("*/*.tmp*"):
        pid, _, host = tmp.name.rsplit(".tmp", 1)[-1].partition("@")
        try:
            if host and host != here:
                if time.time() - tmp.stat().st_mtime > STALE_REMOTE_TMP_S:
                    tmp.unlink(missing_ok=True)
            elif not (pid.isdigit() and _alive(int(pid))):
                tmp.unlink(missing_ok=True)
        except FileNotFoundError:  # renamed or removed by its writer meanwhile
            pass


def _alive(pid: int) -> bool:
    """Whether process `pid` can still write: a zombie (killed, not yet reaped by its new parent,
    e.g. a worker of a killed run waiting for init) cannot."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (not Linux): alive, as kill said
        return True


def _write_json(path: Path, obj: Any) -> None:
    _replace_with(path, json.dumps(obj, indent=1, sort_keys=True))


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    _replace_with(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def _replace_with(path: Path, text: str) -> None:
    """Write `text` to a temporary file and rename it to `path`: all or nothing, a full disk included."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
    except OSError as e:
        tmp.unlink(missing_ok=True)
        full = out_of_space(e, path, "re-run the same command: the entries already written are kept")
        if full is not None:
            raise full from e
        raise
    os.replace(tmp, path)


def _execute(jobs: list[Job], cfg: VisionConfig, out_dir: str, workers: int, verify: bool,
             progress: bool) -> dict[str, BuildOutcome]:
    from tqdm import tqdm

    outcomes: dict[str, BuildOutcome] = {}
    bar = tqdm(total=len(jobs), unit="media", desc="cache", disable=not progress, file=sys.stderr,
               dynamic_ncols=True, smoothing=0.1)
    if workers == 0 or not jobs:
        for job in jobs:
            outcomes[job.key] = _run_job(job, cfg, out_dir, verify)
            bar.update()
    else:
        with ProcessPoolExecutor(workers, mp_context=_pool_context(), initializer=_init_worker,
                                 initargs=(dict(os.environ),)) as pool:
            futures = {pool.submit(_run_job, job, cfg, out_dir, verify): job for job in jobs}
            for future in as_completed(futures):
                job = futures[future]
                try:
                    outcomes[job.key] = future.result()
                except BrokenProcessPool as e:  # a decoder crashed its worker
                    outcomes[job.key] = BuildOutcome(job.key, False, "error",
                                                     f"{job.kind} {job.path}: worker died ({e})")
                bar.update()
    bar.close()
    return outcomes


def build_cache(samples: list[Sample], cfg: VisionConfig, out_dir: str | os.PathLike, workers: int | None = None,
                verify: bool = False, content_hash: bool = False, progress: bool = True,
                extra_failures: Iterable[dict[str, Any]] = ()) -> CacheReport:
    """Decode every media file of `samples` into the cache at `out_dir`; see the module docstring.

    `workers`: processes (None: one per CPU; 0: decode in this process). `extra_failures`:
    rows to put in the failure report as they are (records the loader rejected).
    """
    t0 = time.perf_counter()
    out = Path(out_dir)
    with FolderLock(out, "cache"):  # builders running at once into `out` agree on its config
        _prepare_dir(out, cfg, content_hash)
    params = cfg.key_params()
    report = CacheReport(manifest=str(out / MANIFEST_FILE), failures=str(out / FAILURES_FILE))
    jobs: dict[str, Job] = {}
    sample_keys: list[list[tuple[str, str, str | None, MediaError | None]]] = []  # (kind, path, key, error)
    for sample in samples:
        refs = []
        for kind, path, start, end in _media(sample):
            try:
                source = source_identity(path, kind, content_hash)
            except MediaError as e:
                refs.append((kind, path, None, e))
                continue
            key = entry_key(kind, source, params, start, end)
            if key in jobs:
                report.duplicates += 1
            jobs.setdefault(key, Job(kind, source["path"], start, end, key, source))
            refs.append((kind, path, key, None))
        sample_keys.append(refs)
    report.jobs = len(jobs)
    workers = workers if workers is not None else (os.cpu_count() or 1)
    outcomes = _execute(list(jobs.values()), cfg, str(out), workers, verify, progress)
    _clear_stale_tmp(out)  # workers of a killed earlier run may have died since the start
    for o in outcomes.values():
        report.built += o.reason == "built"
        report.rebuilt += o.reason == "rebuilt"
        report.skipped += o.reason == "skipped"
        report.failed_jobs += not o.ok
        report.bytes_written += o.bytes
    extra = list(extra_failures)
    manifest, failures = [], list(extra)
    for sample, refs in zip(samples, sample_keys):
        bad = []
        for kind, path, key, error in refs:
            outcome = outcomes.get(key) if key else None
            if error is not None:
                bad.append({"file": path, "kind": kind, "reason": error.reason, "detail": str(error)})
            elif outcome is not None and not outcome.ok:
                bad.append({"file": path, "kind": kind, "reason": outcome.reason, "detail": outcome.detail})
        if bad:
            failures += [{"problem_id": sample.problem_id, **b, "sample": sample.to_dict()} for b in bad]
            report.failed_samples += 1
        else:
            keys = {"videos": [k for kind, _, k, _ in refs if kind == "video"],
                    "images": [k for kind, _, k, _ in refs if kind == "image"]}
            manifest.append({**sample.to_dict(), "cache_keys": keys})
    report.ok_samples = len(manifest)
    report.samples = len(samples) + len(extra)
    report.failed_samples += len(extra)
    for f in failures:
        report.failure_reasons[f.get("reason", "?")] = report.failure_reasons.get(f.get("reason", "?"), 0) + 1
    # Other builders may write into `out` at the same time (one per node): take turns, and merge.
    this_run = {_sample_id(row) for row in manifest + failures}
    with FolderLock(out, "cache"):
        _merge_jsonl(out / MANIFEST_FILE, manifest, this_run)
        _merge_jsonl(out / FAILURES_FILE, failures, this_run)
        _update_index(out, jobs.values(), outcomes)
    report.seconds = time.perf_counter() - t0
    return report


def _sample_id(row: dict[str, Any]) -> str:
    """What identifies a manifest or failure row's sample: the sample's whole record (a bad
    record the loader rejected: its file and line)."""
    if "sample" in row:
        return json.dumps(row["sample"], sort_keys=True)
    if "cache_keys" in row:
        return json.dumps({k: v for k, v in row.items() if k != "cache_keys"}, sort_keys=True)
    return json.dumps([row.get("file"), row.get("index")])


def _merge_jsonl(path: Path, rows: list[dict[str, Any]], this_run: set[str]) -> None:
    """Write `rows` to `path`, keeping the rows already there of samples this run did not see
    (another builder's, or an earlier run's); this run's samples replace theirs. Call under the
    folder's lock."""
    kept = []
    if path.exists():
        kept = [row for row in map(json.loads, path.read_text(encoding="utf-8").splitlines())
                if _sample_id(row) not in this_run]
    testhooks.hit("cache.merge")  # tests: widen the read-modify-write window the lock protects
    _write_jsonl(path, kept + rows)


def _update_index(out: Path, jobs: Iterable[Job], outcomes: dict[str, BuildOutcome]) -> None:
    """Record request -> key for every entry now present (lets cache_only work without sources)."""
    path = out / INDEX_FILE
    index = json.loads(path.read_text()) if path.exists() else {}
    for job in jobs:
        if outcomes.get(job.key) is not None and outcomes[job.key].ok:
            index[index_name(job.kind, job.path, job.start, job.end)] = job.key
    _write_json(path, index)
