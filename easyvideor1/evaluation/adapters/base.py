"""`Benchmark`: what an evaluation pipeline needs to know about one benchmark.

The pipeline only does, per benchmark:

    samples = bench.load(data_root)                    # records -> Sample, quirks handled
    store = ResultStore.open(out_dir, bench.name, settings)   # refuses other settings
    for s in store.pending(samples):                   # resume: ids not yet written
        text = bench.prompt(s)                         # user prompt (media go in s.videos, s.images)
        response = engine.generate(...)
        store.append(bench.result_row(s, response, ...))   # extract + score + labels
        # or, when loading/generating failed: store.append(bench.failed_row(s, reason))
    summary = bench.aggregate(store.rows())            # official breakdowns

Scores come from the reward scorers (`easyvideor1.rewards.score`); a benchmark's score is
the scorer's `accuracy` (0/1 for choices, IoU for grounding, MRA for regression...), not the
training reward `overall`: the format term rewards the `<think>`/`<answer>` layout, which an
instruct model under a benchmark's own prompt has no reason to follow.

Media order: a record with both a video and images (Video-MMMU's `image_path`) shows the
video first and the images after it; `prompt` then adds "The image for this question is at
the end of the video." to the question (as upstream EasyVideoR1 does).

Scorer: `score_fn(response, sample) -> RewardResult`, default `easyvideor1.rewards.score`; for
an LLM judge on open-ended answers pass
`functools.partial(rewards.score, cfg=RewardConfig(judge=JudgeConfig(...)))`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from easyvideor1 import rewards
from easyvideor1.data.loading import DataError, LoadResult, Problem, load_records, load_samples, read_records
from easyvideor1.data.templates import render_prompt
from easyvideor1.evaluation.adapters.extract import extract_prediction
from easyvideor1.evaluation.aggregate import Aggregate, accuracy
from easyvideor1.evaluation.bootstrap import Estimand
from easyvideor1.evaluation.results import ResultRow, video_key
from easyvideor1.records import RewardResult, Sample

IMAGE_AFTER_VIDEO_HINT = "The image for this question is at the end of the video."
# Sub-folders searched (after data_root itself) for a benchmark's annotation file.
ANNOTATION_DIRS = ("", "valid_data", "annotations")

ScoreFn = Callable[[str, Sample], RewardResult]  # one response (the trainer's batch form: BatchScoreFn)


def _no_labels(sample: Sample) -> dict[str, str]:
    return {}


def _unchanged(sample: Sample, data_root: Path) -> Sample:
    return sample


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: where its records are, how to prompt, score and summarize them."""

    name: str
    """Registry name (what `--benchmarks` takes)."""
    title: str
    """Display name in reports."""
    files: tuple[str, ...]
    """Annotation file names tried in order under the data root (converted sample schema, or
    the official release layout when `importer` is set)."""
    source: str
    """Where the format and the official metrics come from."""
    breakdowns: tuple[str, ...] = ()
    """Labels reported as per-category tables (a subset of what `labels` returns)."""
    labels: Callable[[Sample], dict[str, str]] = _no_labels
    """Breakdown and grouping labels of a sample, stored in its result row."""
    prepare: Callable[[Sample, Path], Sample] = _unchanged
    """Applied to every loaded sample (map task types, clip bounds...); originals go to extra."""
    summarize: Callable[[str, list[ResultRow]], Aggregate] | None = None
    """Official aggregate from result rows; None: accuracy with the `breakdowns` tables."""
    importer: Callable[[Path, Path], list[Sample] | LoadResult] | None = None
    """Reader of the official release layout (annotation path, data root) -> samples; used
    when the annotation file is not in the sample schema. A `LoadResult` also lists the
    records that are not samples: they are bad records, as in a converted file."""
    official_layout: Callable[[Path], bool] | None = None
    """True when a file is the official layout, for releases that also write `problem_type`
    (LongVideo-Reason's test.jsonl); None: a file without `problem_type` is official."""
    select: Callable[[Sample], bool] | None = None
    """Keeps only the prepared samples it returns True for (a benchmark variant over part of a
    file, e.g. Video-MMMU's question-only Adaptation questions); None keeps all."""
    estimands: Callable[[list[ResultRow]], dict[str, Estimand]] | None = None
    """For the confidence intervals: the scores that are not the plain mean of the rows they
    cover, as `Estimand`s, keyed "overall" or "<breakdown>=<label>" (intervals.py); None: all are."""
    official_score: Callable[[str, Sample], float | None] | None = None
    """The official script's per-sample rule where it differs from the reward scorer's
    accuracy (None for a sample: the scorer's accuracy; otherwise that stays in the row's parts
    as `scorer_accuracy`)."""

    def find_file(self, data_root: str | os.PathLike) -> Path:
        """The first of `files` present under `data_root` (or its valid_data/, annotations/)."""
        root = Path(data_root)
        tried = [root / sub / name for name in self.files for sub in ANNOTATION_DIRS]
        for path in tried:
            if path.is_file():
                return path
        listing = "\n  ".join(str(p) for p in tried)
        raise FileNotFoundError(f"{self.title}: no annotation file under {root}; looked for:\n  {listing}\n"
                                f"Put the file there or pass its path (annotation_file / --annotation).")

    def load(self, data_root: str | os.PathLike | None = None,
             annotation_file: str | os.PathLike | None = None,
             bad_records: list[ResultRow] | None = None) -> list[Sample]:
        """Every record as a Sample (media paths resolved against `data_root`, default the
        annotation file's folder), prepared.

        A benchmark is never silently shortened: without `bad_records` a bad record raises
        `DataError` listing every one; with it, each bad record becomes a failed row appended
        there (named by its problem_id, else its position), which counts in every denominator.
        """
        if annotation_file is not None:
            path = Path(annotation_file)
        elif data_root is None and self.files and Path(self.files[0]).is_absolute():
            path = Path(self.files[0])  # a file benchmark
        elif data_root is None:
            raise ValueError(f"{self.title}: give the data root holding its files and videos")
        else:
            path = self.find_file(data_root)
        root = Path(data_root) if data_root is not None else path.parent
        official = self.official_layout(path) if self.official_layout is not None else not is_sample_schema(path)
        if self.importer is not None and official:
            imported = self.importer(path, root)
            loaded = imported if isinstance(imported, LoadResult) else LoadResult(samples=imported)
            if loaded.problems and bad_records is None:
                listing = "\n  ".join(str(p) for p in loaded.problems)
                raise DataError(f"{path}: {len(loaded.problems)} bad record(s) in {self.title}'s release "
                                f"file:\n  {listing}\n`easyvideor1 eval` scores the other records and "
                                "counts these as failed.")
            samples = loaded.samples
            _fail_records(loaded.problems, samples, path, bad_records,
                          "fix the record or fetch the release file again, and re-run")
        elif bad_records is None:
            samples = load_samples(path, data_root=root, on_error="fail")
        else:
            loaded = load_records(path, root)
            samples = loaded.samples
            _fail_records(loaded.problems, samples, path, bad_records,
                          "fix it, `easyvideor1 check-data` lists them all, and re-run")
        for s in samples:  # labels may need the path as the record wrote it (e.g. video/COIN/x.mp4)
            if s.videos and "://" not in s.videos[0]:
                s.extra.setdefault("video_relpath", _relative(s.videos[0], root))
        prepared = [self.prepare(s, root) for s in samples]
        for s in prepared:  # the cluster of the report's intervals: the video read (a clip's source)
            if s.videos and "://" not in s.videos[0]:
                s.extra.setdefault("video_key", _relative(s.videos[0], root))
        return [s for s in prepared if self.select(s)] if self.select is not None else prepared

    def prompt(self, sample: Sample, template_dir: str | os.PathLike | None = None) -> str:
        """The user prompt text for `sample` (the package's task templates, or `template_dir`'s)."""
        if sample.data_type == "video" and sample.images:  # the hint belongs to the question
            sample = dataclasses.replace(sample, problem=f"{sample.problem}\n{IMAGE_AFTER_VIDEO_HINT}")
        return render_prompt(sample, template_dir=template_dir)

    def score(self, response: str, sample: Sample, score_fn: ScoreFn | None = None) -> RewardResult:
        """The reward scorer's result (default `easyvideor1.rewards.score`)."""
        return (rewards.score if score_fn is None else score_fn)(response, sample)

    def extract(self, response: str, sample: Sample) -> str:
        """The prediction as shown in results (letter, number, interval JSON, answer text)."""
        return extract_prediction(response, sample)

    def result_row(self, sample: Sample, response: str, score_fn: ScoreFn | None = None,
                   prompt_tokens: int | None = None, output_tokens: int | None = None,
                   timing: dict[str, float] | None = None) -> ResultRow:
        """Extract, score and label one response. A scorer error makes a failed row with the
        scorer's message (the sample stays in the denominator)."""
        t0 = time.perf_counter()
        try:
            result = self.score(response, sample, score_fn)
            error = result.error
        except Exception as e:  # noqa: BLE001 - any scorer failure is recorded, never dropped
            result, error = None, f"{type(e).__name__}: {e}"
        timing = {**(timing or {}), "score_s": time.perf_counter() - t0}
        labels = self.labels(sample)
        if error or result is None:
            row = ResultRow.failed(sample, f"scoring failed: {error}", labels, timing)
            row.response = response
            return row
        parts = {k: float(v) for k, v in result.parts.items()}
        value = float(result.accuracy)
        official = self.official_score(response, sample) if self.official_score is not None else None
        if official is not None:
            parts["scorer_accuracy"], value = value, float(official)
        return ResultRow(id=sample.problem_id, status="ok", score=value,
                         prediction=self.extract(response, sample), answer=sample.answer,
                         response=response, problem_type=sample.problem_type,
                         parts=parts, labels=labels, video=video_key(sample),
                         prompt_tokens=prompt_tokens, output_tokens=output_tokens, timing=timing)

    def failed_row(self, sample: Sample, reason: str, timing: dict[str, float] | None = None) -> ResultRow:
        """A failed row (media did not load, generation failed...): scored 0 and counted."""
        return ResultRow.failed(sample, reason, self.labels(sample), timing)

    def aggregate(self, rows: list[ResultRow]) -> Aggregate:
        """The benchmark's summary with its official breakdowns."""
        if self.summarize is not None:
            return self.summarize(self.name, rows)
        return accuracy(self.name, rows, self.breakdowns)


def _fail_records(problems: list[Problem], samples: list[Sample], path: Path,
                  bad_records: list[ResultRow] | None, advice: str) -> None:
    """Append each bad record to `bad_records` (when given) as a failed row named by its
    problem_id, else its position."""
    taken = {s.problem_id for s in samples}
    for p in problems if bad_records is not None else ():
        rid = p.problem_id if p.problem_id and p.problem_id not in taken else f"record-{p.index}"
        bad_records.append(ResultRow(id=rid, status="failed", reason=f"bad record: {p} (in {path}; {advice})"))


def _relative(path: str, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def is_sample_schema(path: str | os.PathLike) -> bool:
    """True when the file's first record is in the sample schema (has `problem_type`)."""
    try:
        for _, raw in read_records(path):
            return isinstance(raw, dict) and "problem_type" in raw
    except DataError:
        return False
    return True  # an empty file: let the loader report it


def video_parts(sample: Sample) -> tuple[str, ...]:
    """Parts of the first video's path relative to the data root (as the record wrote it)."""
    rel = sample.extra.get("video_relpath")
    if rel is None:
        return tuple(Path(sample.videos[0]).parts) if sample.videos else ()
    return tuple(p for p in Path(rel).parts if p not in (".", ".."))


def extra_label(key: str, rename: str | None = None) -> Callable[[Sample], dict[str, str]]:
    """Labels from one extra field of the record (missing: no label)."""

    def labels(sample: Sample) -> dict[str, str]:
        value = sample.extra.get(key)
        return {} if value in (None, "") else {rename or key: str(value)}

    return labels


def with_extra(sample: Sample, **changes: object) -> Sample:
    """A copy of `sample` with fields replaced and the replaced originals kept in extra as
    `original_<field>` (unless already kept)."""
    extra = dict(sample.extra)
    for name in changes:
        extra.setdefault(f"original_{name}", getattr(sample, name))
    return dataclasses.replace(sample, extra=extra, **changes)
