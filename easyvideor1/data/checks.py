"""`easyvideor1 check-data`: every record validated, every problem named with what to do.

Beyond the structural checks of `data.loading` (required fields, types), each record is
checked for: a problem_type the reward dispatcher knows; media files that exist and decode
(two frames of each video, the whole image); and a ground truth that its own scorer reads
(the answer given as the response must score accuracy 1, else the answer cannot be parsed
for its task type; skipped for families an LLM judge scores). A field the loader does not read
that looks like a misspelt one is named in the message (`optoins` for `options`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from easyvideor1.data.loading import Problem, load_records, names_of, typo_hint
from easyvideor1.records import Sample
from easyvideor1.rewards import ANSWER_FORMS, canonical_type, score
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.decode import MediaError, decode_image, decode_video

# Two frames, tiny frames: enough to prove a video opens and decodes, cheap on big datasets.
_PROBE = dict(fps=1.0, min_frames=1, max_frames=2, video_min_pixels=28 * 28, video_max_pixels=56 * 56,
              video_total_pixels=56 * 56 * 2, image_min_pixels=28 * 28, image_max_pixels=56 * 56)


@dataclass
class CheckReport:
    path: str
    total: int = 0
    problems: list[Problem] = field(default_factory=list)


def _sample_problems(sample: Sample, index: int, open_media: bool, probe_cfg: VisionConfig) -> list[Problem]:
    out = []

    def add(msg: str) -> None:
        out.append(Problem(index, sample.problem_id, msg))

    try:
        family = canonical_type(sample.problem_type)
    except ValueError as e:
        add(str(e))
        return out
    if sample.problem_type.lower() in ("multiple choice", "multiple_choice") and not sample.options:
        add("multiple choice record without 'options'" + typo_hint(sample.extra, "options") +
            "; add the option list (e.g. ['A. ...', 'B. ...'])")
    media_typo = typo_hint(sample.extra, *names_of("videos", "images"))
    if sample.data_type == "text" and media_typo:
        add(f"a text-only record, but a field looks like a misspelt media field{media_typo}; "
            "rename it to 'videos' or 'images'")
    result = None
    form = ANSWER_FORMS.get(family)
    try:
        if form is None or not form.judged:  # a judge's verdict cannot be checked without the judge
            result = score(sample.answer, sample)
    except ValueError as e:  # the scorer cannot read the ground truth at all
        add(f"answer cannot be read: {e}")
    if result is not None and result.accuracy < 1.0:
        add(f"answer {sample.answer[:80]!r} cannot be read as a {sample.problem_type} answer (it scores "
            f"{result.accuracy:.2f} against itself); write it in the form the task type expects")
    if open_media:
        for path in sample.videos:
            try:
                decode_video(path, probe_cfg, sample.video_start, sample.video_end)
            except MediaError as e:
                add(f"{e}; fix or replace the file, or drop the record")
        for path in sample.images:
            try:
                decode_image(path, probe_cfg)
            except MediaError as e:
                add(f"{e}; fix or replace the file, or drop the record")
    return out


def check_file(path: str, data_root: str | None = None, open_media: bool = True) -> CheckReport:
    """Check every record of `path`; the report lists each problem (none: the file is good)."""
    from tqdm import tqdm

    loaded = load_records(path, data_root)
    report = CheckReport(path=str(path), total=len(loaded.samples) + len(loaded.problems),
                         problems=list(loaded.problems))
    probe_cfg = VisionConfig(**_PROBE)
    bar = tqdm(loaded.samples, desc="check-data", unit="rec", disable=not sys.stderr.isatty())
    for index, sample in zip(loaded.indices, bar):
        report.problems += _sample_problems(sample, index, open_media, probe_cfg)
    report.problems.sort(key=lambda p: p.index)
    return report


def print_report(report: CheckReport) -> None:
    bad = len({p.index for p in report.problems})
    for p in report.problems:
        print(f"{report.path}: {p}")
    status = "OK" if not report.problems else f"{bad} bad record(s), {len(report.problems)} problem(s)"
    print(f"{report.path}: {report.total} records checked: {status}")
