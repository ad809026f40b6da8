"""Sample files -> `Sample` records.

Reads JSON arrays, JSONL and Parquet in the EasyR1/EasyVideoR1 schema, and the converted
benchmark files EasyVideoR1 users already have (`path` for the video, or for the image of a
`data_type: image` record as Video-R1 writes it; `solution` for the ground truth, `image_path`
for an extra image, `start`/`end` clip bounds), unchanged.
Relative media paths resolve against a data root (default: the file's folder).

Structural validation lives here (required fields, types); the checks that need other
parts of the package (media that open, known problem types, parseable answers) live in
`data.checks`.
"""

from __future__ import annotations

import ast
import difflib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from easyvideor1.errors import UserError
from easyvideor1.records import DATA_TYPES, Sample

log = logging.getLogger(__name__)

ON_ERROR = ("fail", "skip")
# Schema fields consumed into named Sample fields (everything else goes to `extra`).
_CONSUMED = {
    "problem", "answer", "solution", "problem_type", "data_type", "videos", "video", "path",
    "images", "image", "image_path", "options", "problem_id", "data_source",
    "has_offline_trajectory", "offline_output", "start", "end", "video_start", "video_end", "tools",
}
# The other names a field is read under (the converted benchmark files use them), and the rule
# when several are given: the data-format page's table is generated from this, and
# tests/data/test_loading.py checks each alias loads into its field.
FIELD_ALIASES: dict[str, tuple[tuple[str, ...], str]] = {
    "problem": (("question",), "read when `problem` is absent"),
    "answer": (("solution",), "`solution` wins when both are given; `answer` is then kept as "
                              "`original_answer` (MVBench: the option text beside the letter)"),
    "videos": (("path", "video"), "a path or a list of paths; `videos` first, then `path`, then `video`"),
    "images": (("image", "image_path", "path"), "`image` when `images` is absent; `image_path` is added to them; a "
               "record with `data_type: image` and neither `images` nor `image` reads `path` as its image "
               "(Video-R1's image records)"),
    "video_start": (("start",), "seconds; `video_start` wins"),
    "video_end": (("end",), "seconds; `video_end` wins"),
}
KNOWN_FIELDS = _CONSUMED | {"question"}


def names_of(*fields: str) -> tuple[str, ...]:
    """Each field's name and its aliases (`FIELD_ALIASES`)."""
    return tuple(n for f in fields for n in (f, *FIELD_ALIASES.get(f, ((),))[0]))


def typo_hint(raw: dict[str, Any], *names: str) -> str:
    """` (found 'optoins')` when a field of `raw` that the loader does not read looks like a
    misspelling of one of `names`; else ''."""
    for key in raw:
        if isinstance(key, str) and key not in KNOWN_FIELDS and difflib.get_close_matches(key.lower(), names, 1, 0.8):
            return f" (found {key!r})"
    return ""


@dataclass
class Problem:
    """One thing wrong with one record."""

    index: int  # 0-based position of the record in the file (JSONL: line number - 1)
    problem_id: str
    message: str  # what is wrong and what to do

    def __str__(self) -> str:
        where = f"record {self.index}" + (f" (problem_id={self.problem_id})" if self.problem_id else "")
        return f"{where}: {self.message}"


@dataclass
class LoadResult:
    samples: list[Sample] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)  # position in the file of each sample
    problems: list[Problem] = field(default_factory=list)


class DataError(UserError, ValueError):
    """Raised when a data file (or a record in it) cannot be used."""


def read_records(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """Yield (index, raw record) from a JSON array, JSONL or Parquet file.

    A JSONL line that is not valid JSON is yielded as an error string, so one bad line
    does not hide the rest of the file.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"data file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield i, row
    elif suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    yield i, json.loads(line)
                except json.JSONDecodeError as e:
                    yield i, f"line {i + 1} is not valid JSON ({e.msg} at column {e.colno})"
    elif suffix == ".json":
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise DataError(f"{path} is not valid JSON: {e}; fix the file or convert it to JSONL") from e
        if isinstance(data, dict):  # {"data": [...]} style
            data = next((v for v in data.values() if isinstance(v, list)), None)
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON array of records")
        yield from enumerate(data)
    else:
        raise DataError(f"{path}: unsupported data file type {suffix!r}; use .json, .jsonl or .parquet")


def _as_list(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if v not in (None, "")]
    return [str(value)]


def _resolve(paths: list[str], root: Path) -> list[str]:
    return [p if os.path.isabs(p) or "://" in p else os.path.normpath(root / p) for p in paths]


def record_to_sample(raw: dict[str, Any], index: int, data_root: str | os.PathLike) -> Sample:
    """Convert one raw record; raises `DataError` naming the record when it is malformed."""
    pid = str(raw.get("problem_id", "")) if isinstance(raw, dict) else ""

    def bad(msg: str) -> DataError:
        return DataError(str(Problem(index, pid, msg)))

    if not isinstance(raw, dict):
        raise bad(f"expected an object, got {type(raw).__name__}")
    extra = {k: v for k, v in raw.items() if k not in _CONSUMED}
    raw = {k: v for k, v in raw.items() if v is not None}  # Parquet fills absent columns with null
    problem = raw.get("problem", raw.get("question"))
    has_media = any(raw.get(k) for k in ("videos", "video", "path", "images", "image", "image_path"))
    # Media records may leave the text empty (captioning): the template gives the instruction.
    if problem is not None and not isinstance(problem, str):
        raise bad(f"'problem' must be a string (the question text), got {type(problem).__name__} {problem!r}")
    if not isinstance(problem, str) or not (problem.strip() or has_media):
        raise bad("missing or empty 'problem' (the question text)" + typo_hint(raw, *names_of("problem")))
    answer = raw.get("solution", raw.get("answer"))
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise bad("missing 'answer' (or 'solution'): every record needs a ground truth" +
                  typo_hint(raw, *names_of("answer")))
    if isinstance(answer, (list, dict)):
        answer = json.dumps(answer)
    problem_type = raw.get("problem_type")
    if not isinstance(problem_type, str) or not problem_type.strip():
        raise bad("missing 'problem_type' (e.g. 'multiple choice', 'numerical', 'temporal grounding')" +
                  typo_hint(raw, "problem_type"))
    # Video-R1 names either kind of media `path`: the image of a `data_type: image` record, else a video
    path_is_image = raw.get("data_type") == "image" and "path" in raw and not ("images" in raw or "image" in raw)
    videos = _as_list(raw.get("videos", raw.get("video") if "path" not in raw or path_is_image else raw["path"]))
    images = (_as_list(raw["path"] if path_is_image else raw.get("images", raw.get("image")))
              + _as_list(raw.get("image_path")))
    data_type = raw.get("data_type") or ("video" if videos else "image" if images else "text")
    if data_type not in DATA_TYPES:
        raise bad(f"data_type {data_type!r} is not one of {', '.join(DATA_TYPES)}")
    if data_type == "video" and not videos:
        raise bad("data_type is 'video' but the record names no video ('videos' or 'path')" +
                  typo_hint(raw, *names_of("videos")))
    if data_type == "image" and not images:
        raise bad("data_type is 'image' but the record names no image ('images', 'path' or 'image_path')" +
                  typo_hint(raw, *names_of("images")))
    for tag, media in (("<video>", videos), ("<image>", images)):
        if problem.count(tag) > len(media):
            raise bad(f"the problem text has {problem.count(tag)} {tag} placeholders but the record names "
                      f"{len(media)} {tag[1:-1]}(s); put one placeholder per media item, or none (media then go first)")
    options = raw.get("options")
    if isinstance(options, str) and options.strip().startswith("["):
        try:  # VideoMathQA writes options as a Python list literal inside a string
            options = ast.literal_eval(options)
        except (ValueError, SyntaxError):
            raise bad(f"'options' is a string that is not a list: {options[:60]!r}") from None
    if options is not None and not isinstance(options, list):
        raise bad(f"'options' must be a list of strings, got {type(options).__name__}")
    start = raw.get("video_start", raw.get("start"))
    end = raw.get("video_end", raw.get("end"))
    for name, v in (("start", start), ("end", end)):
        if v is not None and not isinstance(v, (int, float)):
            raise bad(f"clip bound '{name}' must be a number of seconds, got {v!r}")
    if start is not None and end is not None and end <= start:
        raise bad(f"clip bounds start={start} end={end}: end must be after start")
    tools = raw.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
        raise bad(f"'tools' must be a list of tool names (e.g. [\"crop_video\"], or [] for none), got {tools!r}")
    offline = raw.get("offline_output")
    if "solution" in raw and "answer" in raw:
        extra["original_answer"] = raw["answer"]  # e.g. MVBench: option text beside the letter
    root = Path(data_root)
    return Sample(
        problem=problem,
        answer=str(answer),
        problem_type=problem_type.strip(),
        data_type=data_type,
        videos=_resolve(videos, root),
        images=_resolve(images, root),
        options=[str(o) for o in options] if options else None,
        problem_id=pid or str(index),
        data_source=str(raw.get("data_source") or ""),
        has_offline_trajectory=bool(raw.get("has_offline_trajectory", offline is not None)),
        offline_output=offline,
        video_start=float(start) if start is not None else None,
        video_end=float(end) if end is not None else None,
        tools=tools,
        extra=extra,
    )


def make_id_unique(sample: Sample, seen: dict[str, int]) -> None:
    """Real files repeat ids (VideoMathQA's multi-binary variants): keep every record and make the
    id unique by occurrence (`id#2`, `id#3`, ...), stable across runs (resume relies on it);
    `seen` counts the ids met so far in the file."""
    n = seen.get(sample.problem_id, 0)
    seen[sample.problem_id] = n + 1
    if n:
        sample.extra["original_problem_id"] = sample.problem_id
        sample.problem_id = f"{sample.problem_id}#{n + 1}"


def load_records(path: str | os.PathLike, data_root: str | os.PathLike | None = None) -> LoadResult:
    """Every record of a file as a Sample, and a Problem for each record that is not one."""
    root = Path(data_root) if data_root is not None else Path(path).parent
    result = LoadResult()
    seen: dict[str, int] = {}  # problem_id -> occurrences so far
    for index, raw in read_records(path):
        if isinstance(raw, str):
            result.problems.append(Problem(index, "", raw + "; fix or delete the line"))
            continue
        try:
            sample = record_to_sample(raw, index, root)
        except DataError as e:
            result.problems.append(Problem(index, str(raw.get("problem_id", "")) if isinstance(raw, dict) else "",
                                           str(e).split(": ", 1)[-1]))
            continue
        make_id_unique(sample, seen)
        result.samples.append(sample)
        result.indices.append(index)
    return result


def load_samples(path: str | os.PathLike, data_root: str | os.PathLike | None = None,
                 on_error: str = "fail") -> list[Sample]:
    """Load a sample file. `on_error="fail"` raises on the first bad record (all listed);
    `"skip"` logs each bad record and keeps the valid ones."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error={on_error!r}; choose one of {', '.join(ON_ERROR)}")
    result = load_records(path, data_root)
    if result.problems:
        listing = "\n  ".join(str(p) for p in result.problems[:20])
        more = f"\n  ... and {len(result.problems) - 20} more" if len(result.problems) > 20 else ""
        if on_error == "fail":
            raise DataError(f"{path}: {len(result.problems)} bad record(s):\n  {listing}{more}\n"
                            "Fix them, run `easyvideor1 check-data` for a full report, or set "
                            "data.on_error=skip to train on the valid records.")
        log.warning("%s: skipped %d bad record(s):\n  %s%s", path, len(result.problems), listing, more)
    return result.samples


def write_jsonl(path: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """Write rows as JSONL atomically (temporary file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
