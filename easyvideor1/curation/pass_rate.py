"""`easyvideor1 pass-rate`: k responses per sample from the starting model; keep the samples whose
GRPO group has a learning signal (min < pass rate < max, by default 0 < pass@k < 1).

    OUT/pass_rates.jsonl   one `PassRateRow` per input record (resume key: id), appended as done
    OUT/filtered.jsonl     the input records, unchanged and in input order, with min < rate < max
    OUT/summary.md|json    per problem_type: kept / always solved (>= max) / never solved (<= min) / failed
    OUT/pass_rate_<type>.png   histogram of the pass rates of each problem_type
    OUT/settings.json      what changes the responses; a resume under other settings is refused

The pass rate is the mean reward accuracy of the k responses (for 0/1 tasks: the fraction
solved; for IoU-scored grounding: the mean IoU). `filtered.jsonl`, the summary and the
histograms are rebuilt from pass_rates.jsonl at the end of every run, so a re-run with other
--min/--max only re-filters. They hold an id -> rate map (one float per sample), not the samples.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from easyvideor1.curation.records_io import IdLog, JsonlWriter, check_run_settings, read_rows, stream_records
from easyvideor1.curation.runner import Outcome, RunOptions, run
from easyvideor1.curation.sources import Source
from easyvideor1.rollout.base import SamplingParams

RATES_FILE, FILTERED_FILE, PASS_RATE_SETTINGS = "pass_rates.jsonl", "filtered.jsonl", "settings.json"


@dataclass
class PassRateRow:
    """One sample's k responses and their rewards (or why it failed)."""

    id: str
    """The sample id (resume key)."""
    problem_type: str
    status: str
    """`ok` or `failed`."""
    k: int
    pass_rate: float | None = None
    """Mean accuracy of the k responses (None when failed)."""
    rewards: list[float] = field(default_factory=list)
    """Overall reward of each response (accuracy and format, as in training)."""
    accuracies: list[float] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    reason: str | None = None
    """Why the sample failed."""


def row_from(out: Outcome, k: int) -> PassRateRow:
    rec = out.record
    ptype = rec.sample.problem_type if rec.sample else str((rec.raw or {}).get("problem_type", ""))
    if out.error is not None:
        return PassRateRow(id=rec.id, problem_type=ptype, status="failed", k=k, responses=out.texts,
                           finish_reasons=out.finish_reasons, reason=out.error)
    acc = [r.accuracy for r in out.rewards]
    return PassRateRow(id=rec.id, problem_type=ptype, status="ok", k=k, pass_rate=sum(acc) / len(acc),
                       rewards=[r.overall for r in out.rewards], accuracies=acc, responses=out.texts,
                       finish_reasons=out.finish_reasons)


def pass_rate(data: str, out_dir: str, source: Source, params: SamplingParams, k: int,
              data_root: str | None = None, lo: float = 0.0, hi: float = 1.0,
              options: RunOptions | None = None) -> dict:
    """Run (or resume) the pass-rate pass over `data`, then filter and summarize; return the summary."""
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"need 0 <= --min ({lo}) < --max ({hi}) <= 1")
    out = Path(out_dir)
    flat = {**source.settings, "k": k, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k, "max_tokens": params.max_tokens, "seed": params.seed}
    check_run_settings(out / PASS_RATE_SETTINGS, flat)
    log = IdLog(out / RATES_FILE)
    try:
        run(data, data_root, source, params, k, log.ids, lambda o: log.append(asdict(row_from(o, k))),
            "pass-rate", options)
    finally:
        log.close()
    return write_outputs(data, out, k, data_root, lo, hi)


def write_outputs(data: str, out: Path, k: int, data_root: str | None, lo: float, hi: float) -> dict:
    """filtered.jsonl, summary.md/json and the histograms, from pass_rates.jsonl."""
    rates: dict[str, float | None] = {}
    types: dict[str, dict] = {}
    failed: list[tuple[str, str]] = []
    for row in read_rows(out / RATES_FILE):
        rate, ptype = row["pass_rate"], row["problem_type"] or "(none)"
        rates[row["id"]] = rate
        t = types.setdefault(ptype, {"total": 0, "kept": 0, "always_solved": 0, "never_solved": 0,
                                     "failed": 0, "rates": []})
        t["total"] += 1
        if rate is None:
            t["failed"] += 1
            failed.append((row["id"], row["reason"]))
        else:
            t["rates"].append(rate)
            t["kept" if lo < rate < hi else "always_solved" if rate >= hi else "never_solved"] += 1
    writer = JsonlWriter(out / FILTERED_FILE)
    try:
        for rec in stream_records(data, data_root):
            rate = rates.get(rec.id)
            if rec.raw is not None and rate is not None and lo < rate < hi:
                writer.write(rec.raw)
    finally:
        writer.close()
    pictures = {ptype: _histogram(out, ptype, t["rates"], k, lo, hi) for ptype, t in sorted(types.items())}
    summary = {"min": lo, "max": hi, "k": k,
               "types": {p: {key: v for key, v in t.items() if key != "rates"} for p, t in sorted(types.items())},
               "failed": [{"id": i, "reason": r} for i, r in failed],
               "histograms": {p: str(path) for p, path in pictures.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(pass_rate_table(summary) + "\n", encoding="utf-8")
    return summary


def pass_rate_table(summary: dict) -> str:
    """The final table: per problem_type kept / always solved / never solved / failed."""
    lo, hi = summary["min"], summary["max"]
    lines = [f"| problem_type | samples | kept ({lo:g} < rate < {hi:g}) | always solved (>= {hi:g}) | "
             f"never solved (<= {lo:g}) | failed |", "|---|---:|---:|---:|---:|---:|"]
    totals = {"total": 0, "kept": 0, "always_solved": 0, "never_solved": 0, "failed": 0}
    for ptype, t in summary["types"].items():
        lines.append(f"| {ptype} | {t['total']} | {t['kept']} | {t['always_solved']} | {t['never_solved']} | "
                     f"{t['failed']} |")
        for key in totals:
            totals[key] += t[key]
    lines.append(f"| all | {totals['total']} | {totals['kept']} | {totals['always_solved']} | "
                 f"{totals['never_solved']} | {totals['failed']} |")
    for item in summary["failed"][:20]:
        lines.append(f"\nfailed: {item['id']}: {item['reason']}")
    if len(summary["failed"]) > 20:
        lines.append(f"\n... and {len(summary['failed']) - 20} more failed samples (status failed in {RATES_FILE})")
    return "\n".join(lines)


def _histogram(out: Path, ptype: str, rates: list[float], k: int, lo: float, hi: float) -> Path:
    """PNG histogram of one problem_type's pass rates; bins centred on the multiples of 1/k."""
    from matplotlib.figure import Figure

    path = out / f"pass_rate_{re.sub(r'[^A-Za-z0-9]+', '_', ptype).strip('_') or 'none'}.png"
    fig = Figure(figsize=(5, 3.2))
    ax = fig.add_subplot()
    edges = [(i - 0.5) / k for i in range(k + 2)]
    ax.hist(rates, bins=edges, color="#4878d0", edgecolor="white")
    for x in (lo, hi):
        ax.axvline(x, color="#d65f5f", linestyle="--", linewidth=1)
    ax.set_xlabel(f"pass rate (mean accuracy of k={k})")
    ax.set_ylabel("samples")
    ax.set_title(f"{ptype}: {len(rates)} samples")
    fig.tight_layout()
    tmp = path.with_name(path.name + f".tmp{os.getpid()}.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)
    return path
