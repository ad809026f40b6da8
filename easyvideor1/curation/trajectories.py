"""`easyvideor1 trajectories`: an `offline_output` per sample for hybrid groups, from a teacher's
k responses (local engine or OpenAI-compatible endpoint), checked by the project's rewards.

    OUT                   the input records with `offline_output` (a response whose accuracy is
                          >= --min-accuracy; the shortest or the first) and `has_offline_trajectory`
    OUT.rejected.jsonl    the other records, with `rejected_reason` (no response good enough, or
                          the sample failed: bad record, media, endpoint, scoring) and accuracies
    OUT.settings.json     what changes the responses; a resume under other settings is refused

Both files are appended as samples finish and keyed by `problem_id`: a re-run skips the ids in
either. The written `problem_id` is the id the loader gives the record (its index when it has
none, `id#n` for the n-th repeat), so the output's ids are unique. A response is judged by its
score alone (one cut at the token limit is kept when it scores; hybrid training appends the
end-of-turn token to it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from easyvideor1.curation.records_io import IdLog, check_run_settings, read_rows
from easyvideor1.curation.runner import Outcome, RunOptions, run
from easyvideor1.curation.sources import Source
from easyvideor1.rollout.base import SamplingParams


def _shortest(candidates: list[str]) -> str:
    return min(candidates, key=len)


def _first(candidates: list[str]) -> str:
    return candidates[0]


PICKS: dict[str, Callable[[list[str]], str]] = {"shortest": _shortest, "first": _first}


def rejected_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name.removesuffix(".jsonl") + ".rejected.jsonl")


def settings_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name.removesuffix(".jsonl") + ".settings.json")


def choose(out: Outcome, min_accuracy: float, pick: str) -> str | None:
    """The response to keep, or None when none is good enough."""
    good = [text for text, reward in zip(out.texts, out.rewards)
            if reward.accuracy >= min_accuracy and reward.error is None and text.strip()]
    return PICKS[pick](good) if good else None


def trajectories(data: str, out: str, source: Source, params: SamplingParams, k: int = 4,
                 data_root: str | None = None, min_accuracy: float = 1.0, pick: str = "shortest",
                 options: RunOptions | None = None) -> dict:
    """Run (or resume) the teacher over `data`; return per problem_type counts."""
    if pick not in PICKS:
        raise ValueError(f"--pick {pick!r}: choose one of {', '.join(PICKS)}")
    if not 0.0 <= min_accuracy <= 1.0:
        raise ValueError(f"--min-accuracy must lie in [0, 1], got {min_accuracy}")
    flat = {**source.settings, "k": k, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k, "max_tokens": params.max_tokens, "seed": params.seed,
            "min_accuracy": min_accuracy, "pick": pick}
    check_run_settings(settings_path(out), flat)
    kept, rejected = IdLog(out, key="problem_id"), IdLog(rejected_path(out), key="problem_id")
    if kept.ids & rejected.ids:
        raise ValueError(f"{out} and {rejected_path(out)} share ids {sorted(kept.ids & rejected.ids)[:5]}")

    def write(o: Outcome) -> None:
        record = {**(o.record.raw or {}), "problem_id": o.record.id}
        accuracies = [r.accuracy for r in o.rewards]
        text = None if o.error is not None else choose(o, min_accuracy, pick)
        if text is not None:
            kept.append({**record, "offline_output": text, "has_offline_trajectory": True})
            return
        reason = o.error or (f"no response of {k} reached accuracy {min_accuracy:g} "
                             f"(accuracies {', '.join(f'{a:.2f}' for a in accuracies)})")
        rejected.append({**record, "rejected_reason": reason, "rejected_failed": o.error is not None,
                         "rejected_accuracies": accuracies})

    try:
        run(data, data_root, source, params, k, kept.ids | rejected.ids, write, "trajectories", options)
    finally:
        kept.close()
        rejected.close()
    for path in (Path(out), rejected_path(out)):  # both exist, as the command says, even when one stays empty
        path.touch()
    return summarize(out)


def summarize(out: str | Path) -> dict[str, dict[str, int]]:
    """problem_type -> {kept, no_correct, failed} from the two output files."""
    counts: dict[str, dict[str, int]] = {}
    for path, kind in ((Path(out), "kept"), (rejected_path(out), None)):
        for row in read_rows(path):
            c = counts.setdefault(str(row.get("problem_type", "") or "(none)"),
                                  {"kept": 0, "no_correct": 0, "failed": 0})
            c[kind or ("failed" if row.get("rejected_failed") else "no_correct")] += 1
    return dict(sorted(counts.items()))


def trajectories_table(counts: dict[str, dict[str, int]], out: str | Path) -> str:
    """The final table, then the failed samples with their reasons."""
    lines = ["| problem_type | kept | no correct response | failed |", "|---|---:|---:|---:|"]
    total = {"kept": 0, "no_correct": 0, "failed": 0}
    for ptype, c in counts.items():
        lines.append(f"| {ptype} | {c['kept']} | {c['no_correct']} | {c['failed']} |")
        for key in total:
            total[key] += c[key]
    lines.append(f"| all | {total['kept']} | {total['no_correct']} | {total['failed']} |")
    failed = [r for r in read_rows(rejected_path(out)) if r.get("rejected_failed")]
    for r in failed[:20]:
        lines.append(f"\nfailed: {r['problem_id']}: {r['rejected_reason']}")
    if len(failed) > 20:
        lines.append(f"\n... and {len(failed) - 20} more (rejected_failed in {rejected_path(out)})")
    return "\n".join(lines)
