"""The results store: one append-only JSONL file per benchmark, keyed by sample id.

Layout of a results folder:

    RESULTS_DIR/settings.json         score-changing settings and their hashes (settings.py)
    RESULTS_DIR/<benchmark>.jsonl     one `ResultRow` per line, flushed as it is written

Resume reads the ids already written and skips exactly those (upstream counted lines, so a
reordered or filtered benchmark redid or skipped the wrong samples). A process killed while
writing leaves at most one partial last line: it is ignored, cut off before the next append,
and its sample redone. Any other unreadable line is an error naming the file and line, since
no interrupted run produces it. A sample that failed to load or generate is written as a
`failed` row with its reason, so it stays in every denominator.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Self

from easyvideor1 import testhooks
from easyvideor1.errors import UserError, out_of_space
from easyvideor1.evaluation.settings import (
    UNHASHED_KEYS,
    EvalSettings,
    differences,
    settings_hash,
)
from easyvideor1.records import Sample

log = logging.getLogger(__name__)

STATUSES = ("ok", "failed")
SETTINGS_FILE = "settings.json"


@dataclass
class ResultRow:
    """One sample's outcome. `score` lies in [0, 1]; a failed row scores 0."""

    id: str
    """The sample's problem_id (unique within its benchmark; the resume key)."""
    status: str
    """`ok` or `failed`."""
    score: float = 0.0
    """Benchmark score of the response (the scorer's accuracy: 0/1, IoU, MRA, ...)."""
    prediction: str = ""
    """The answer read from the response (letter, number, interval...), as shown in reports."""
    answer: str = ""
    """The ground truth, as shown in reports."""
    response: str = ""
    """The raw model output."""
    problem_type: str = ""
    """The task type the response was scored as."""
    parts: dict[str, float] = field(default_factory=dict)
    """Named sub-scores from the scorer (e.g. temporal and box IoU)."""
    labels: dict[str, str] = field(default_factory=dict)
    """The benchmark's breakdown labels of this sample (duration, task, group...)."""
    video: str = ""
    """The sample's video (first one; path under the data root where known), "" for none: the
    cluster of the report's confidence intervals (questions on one video are correlated)."""
    prompt_tokens: int | None = None
    """Prompt length including vision tokens, when the engine reports it."""
    output_tokens: int | None = None
    """Generated tokens."""
    timing: dict[str, float] = field(default_factory=dict)
    """Seconds per stage (e.g. load_s, generate_s, score_s)."""
    reason: str | None = None
    """Why the sample failed (None when ok)."""
    turns: list[str] = field(default_factory=list)
    """Multi-turn responses (`eval --tools`): the model's turns in order (`response` is the last)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Multi-turn responses: each tool call (name, arguments, error, visual_tokens)."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"result {self.id!r}: status {self.status!r} is not one of {STATUSES}")
        if self.status == "failed" and not self.reason:
            raise ValueError(f"result {self.id!r}: a failed row needs a reason")
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"result {self.id!r}: score {self.score} is outside [0, 1]")

    @classmethod
    def failed(cls, sample: Sample, reason: str, labels: dict[str, str] | None = None,
               timing: dict[str, float] | None = None) -> ResultRow:
        """A failed row for `sample` (could not be loaded, generated or scored)."""
        return cls(id=sample.problem_id, status="failed", answer=sample.answer,
                   problem_type=sample.problem_type, labels=dict(labels or {}), video=video_key(sample),
                   timing=dict(timing or {}), reason=reason)

    def to_json(self) -> str:
        """The row as one JSON line (no trailing newline)."""
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResultRow:
        """Inverse of `to_json` (unknown keys are ignored, so older files still read)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def video_key(sample: Sample) -> str:
    """The video a result row records (`ResultRow.video`): the `video_key` that `Benchmark.load`
    sets (the prepared video's path under the data root), else the first video's path."""
    return str(sample.extra.get("video_key") or (sample.videos[0] if sample.videos else ""))


class SettingsMismatch(UserError, ValueError):
    """A resume or comparison across different score-changing settings."""


def write_settings(results_dir: str | os.PathLike, settings: EvalSettings) -> None:
    """Write settings.json (flat settings plus both hashes)."""
    path = Path(results_dir) / SETTINGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"hash": settings.hash, "protocol_hash": settings.protocol_hash, "settings": settings.flat()}
    if settings.sources:
        data["sources"] = settings.sources
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_settings(results_dir: str | os.PathLike) -> dict[str, Any]:
    """The flat settings stored in a results folder (raises naming the folder when absent)."""
    path = Path(results_dir) / SETTINGS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {results_dir} is not an evaluation "
                                "results folder (run `easyvideor1 eval --out` to make one)")
    return json.loads(path.read_text(encoding="utf-8"))["settings"]


def check_settings(results_dir: str | os.PathLike, settings: EvalSettings) -> None:
    """Write settings.json in a new folder; in an existing one, refuse different settings."""
    if not (Path(results_dir) / SETTINGS_FILE).exists():
        write_settings(results_dir, settings)
        return
    stored = read_settings(results_dir)
    if settings_hash(stored) != settings.hash:
        lines = "\n  ".join(differences(stored, settings.flat()))
        raise SettingsMismatch(
            f"{results_dir} holds results generated with other settings (stored != requested):\n"
            f"  {lines}\nResume with the stored settings, or write to a new --out folder.")


def check_comparable(dir_a: str | os.PathLike, dir_b: str | os.PathLike) -> None:
    """Refuse to compare two results folders whose protocols (settings but the model) differ."""
    a, b = read_settings(dir_a), read_settings(dir_b)
    if settings_hash(a, UNHASHED_KEYS) != settings_hash(b, UNHASHED_KEYS):
        lines = "\n  ".join(differences(a, b, exclude=UNHASHED_KEYS))
        raise SettingsMismatch(
            f"{dir_a} and {dir_b} were evaluated under different settings, so their scores are "
            f"not comparable:\n  {lines}\nRe-run one of them with the other's settings.")


class ResultStore:
    """The results file of one benchmark: read what is there, append new rows one by one."""

    def __init__(self, path: str | os.PathLike, repair: bool = True):
        """Read `path` if it exists. `repair=False` only reads: a partial last line is skipped
        but left in the file (for reports, which must not modify results)."""
        self.path = Path(path)
        self._rows: dict[str, ResultRow] = {}
        self._file = None
        self._read_only = not repair
        self._load(repair)

    @classmethod
    def open(cls, results_dir: str | os.PathLike, benchmark: str,
             settings: EvalSettings | None = None) -> ResultStore:
        """The store of `benchmark` in `results_dir`; with `settings`, check them first."""
        if settings is not None:
            check_settings(results_dir, settings)
        return cls(Path(results_dir) / f"{benchmark_file_stem(benchmark)}.jsonl")

    def _load(self, repair: bool) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = len(data) if data.endswith(b"\n") else data.rfind(b"\n") + 1
        if end < len(data):
            log.warning("%s: ignoring a partial last line (%d bytes) left by an interrupted run; "
                        "that sample will be redone", self.path, len(data) - end)
            if repair:
                with open(self.path, "r+b") as f:  # cut it now, so the next append starts a line
                    f.truncate(end)
        for lineno, line in enumerate(data[:end].decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = ResultRow.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError, ValueError) as e:
                raise ValueError(f"{self.path} line {lineno} is not a result row ({e}); it is not the "
                                 "last line, so no interrupted run wrote it: fix or delete the line") from e
            if row.id in self._rows:
                raise ValueError(f"{self.path} line {lineno}: sample id {row.id!r} is written twice; "
                                 "delete one of the two lines")
            self._rows[row.id] = row

    def done_ids(self) -> set[str]:
        """Ids of the samples already written (ok or failed)."""
        return set(self._rows)

    def rows(self) -> list[ResultRow]:
        """Every row, in file order."""
        return list(self._rows.values())

    def pending(self, samples: Iterable[Sample]) -> list[Sample]:
        """The samples not yet written, in the given order."""
        return [s for s in samples if s.problem_id not in self._rows]

    def append(self, row: ResultRow) -> None:
        """Write one row straight to the OS (no buffer: it survives the process being killed).
        A full disk truncates the file back to its last whole row and raises `OutOfSpace`."""
        if self._read_only:
            raise ValueError(f"{self.path} was opened read-only (repair=False); open it with "
                             "ResultStore.open to append")
        if row.id in self._rows:
            raise ValueError(f"{self.path}: sample {row.id!r} already has a result; resume skips "
                             "written ids, so this is a second run over the same sample")
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - kept open across appends
        data = (row.to_json() + "\n").encode("utf-8")
        whole = os.fstat(self._file.fileno()).st_size
        try:
            if testhooks.armed("results.flush"):  # a test kills the run with half this row on disk
                self._write(data[: len(data) // 2])
                testhooks.hit("results.flush")
                data = data[len(data) // 2:]
            self._write(data)
        except OSError as e:
            os.truncate(self.path, whole)  # no partial row left behind
            full = out_of_space(e, self.path, "re-run the same command: it resumes after the rows written")
            if full is not None:
                raise full from e
            raise
        self._rows[row.id] = row

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._file.write(view):]

    def close(self) -> None:
        """Close the file (appending again reopens it)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def benchmark_file_stem(benchmark: str) -> str:
    """File name stem for a benchmark: its registry name, or for a file benchmark the file's
    stem prefixed `file-` (so `--benchmarks a/val.jsonl` writes `file-val.jsonl`)."""
    if benchmark.endswith((".json", ".jsonl", ".parquet")) or os.sep in benchmark:
        return "file-" + Path(benchmark).stem
    return benchmark


def read_results(results_dir: str | os.PathLike) -> dict[str, list[ResultRow]]:
    """{benchmark file stem: rows} for every results file in a folder (report input)."""
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"results folder {root} does not exist")
    return {p.stem: ResultStore(p, repair=False).rows() for p in sorted(root.glob("*.jsonl"))}
