"""Streaming input and resumable output for the curation commands.

Input records are read one at a time (`stream_records`), with the ids `data.load_records`
gives them (a missing problem_id is the record's index, a repeated one gets `#n`), so a
100k-sample file is never held in memory. Output files are append-only JSONL keyed by id:
`IdLog` keeps only the ids written, flushes every row, and on re-open cuts a partial last line
left by a killed process (that sample is redone). `settings.json` beside the outputs refuses a
resume under settings that change the results.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from easyvideor1.data.loading import DataError, make_id_unique, read_records, record_to_sample
from easyvideor1.errors import UserError
from easyvideor1.evaluation.settings import differences, settings_hash
from easyvideor1.records import Sample

log = logging.getLogger(__name__)


@dataclass
class InputRecord:
    """One record of the input file: the raw dict as read, and its Sample or why it is none."""

    index: int
    """Position in the file (JSONL: line number - 1)."""
    id: str
    """The sample id (resume key), as `data.load_records` assigns it."""
    raw: dict[str, Any] | None
    """The record exactly as read (None for a line that is not JSON)."""
    sample: Sample | None
    """The parsed sample; None when the record is malformed (then `problem` says why)."""
    problem: str | None = None


def stream_records(path: str | os.PathLike, data_root: str | os.PathLike | None = None) -> Iterator[InputRecord]:
    """Every record of a sample file, in file order, one at a time."""
    root = Path(data_root) if data_root is not None else Path(path).parent
    seen: dict[str, int] = {}  # id -> occurrences so far (ids only, as load_records keeps)
    for index, raw in read_records(path):
        if isinstance(raw, str):
            yield InputRecord(index, str(index), None, None, raw + "; fix or delete the line")
            continue
        try:
            sample = record_to_sample(raw, index, root)
        except DataError as e:
            pid = str(raw.get("problem_id", "")) if isinstance(raw, dict) else ""
            yield InputRecord(index, pid or str(index), raw if isinstance(raw, dict) else None, None, str(e))
            continue
        make_id_unique(sample, seen)
        yield InputRecord(index, sample.problem_id, raw, sample)


def count_records(path: str | os.PathLike) -> int:
    """How many records the file holds (for the progress bar's total)."""
    return sum(1 for _ in read_records(path))


class IdLog:
    """An append-only JSONL file of rows keyed by `key`; only the ids are kept in memory."""

    def __init__(self, path: str | os.PathLike, key: str = "id"):
        self.path, self.key = Path(path), key
        self.ids: set[str] = set()
        self._file = None
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        data = self.path.read_bytes()
        end = len(data) if data.endswith(b"\n") else data.rfind(b"\n") + 1
        if end < len(data):
            log.warning("%s: cutting a partial last line (%d bytes) left by an interrupted run; "
                        "that sample will be redone", self.path, len(data) - end)
            with open(self.path, "r+b") as f:
                f.truncate(end)
        with open(self.path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row_id = str(json.loads(line)[self.key])
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise UserError(f"{self.path} line {lineno} is not a row with a {self.key!r} ({e}); no "
                                    "interrupted run writes that: fix or delete the line") from e
                if row_id in self.ids:
                    raise UserError(f"{self.path} line {lineno}: id {row_id!r} is written twice; delete one line")
                self.ids.add(row_id)

    def append(self, row: dict[str, Any]) -> None:
        """Write one row and flush it (it survives the process being killed)."""
        row_id = str(row[self.key])
        if row_id in self.ids:
            raise ValueError(f"{self.path}: id {row_id!r} already written")
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across appends
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()
        self.ids.add(row_id)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_rows(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The complete rows of a JSONL output file, one at a time."""
    if not Path(path).exists():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n") and line.strip():
                yield json.loads(line)


class JsonlWriter:
    """Write a JSONL file atomically: rows go to a temporary file renamed over `path` on close."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(self.path.name + f".tmp{os.getpid()}")
        self._file = open(self._tmp, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self._file.close()
        os.replace(self._tmp, self.path)


class CurationSettingsMismatch(UserError, ValueError):
    """A resume under settings that change the results."""


def check_run_settings(path: str | os.PathLike, flat: dict[str, Any]) -> None:
    """Write `flat` to `path` on a first run; on a resume, refuse different settings."""
    path = Path(path)
    if path.exists():
        stored = json.loads(path.read_text(encoding="utf-8"))
        if settings_hash(stored) != settings_hash(flat):
            lines = "\n  ".join(differences(stored, flat))
            raise CurationSettingsMismatch(
                f"{path} records other settings than this run's (stored != requested):\n  {lines}\n"
                "Resume with the stored settings, or write to a new output.")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(flat, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def progress(total: int, done: int, desc: str):
    """The progress bar the eval command shows (tqdm: count, rate, ETA)."""
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=desc, unit="sample", dynamic_ncols=True)
