"""The `easyvideor1 score` command: score saved model outputs against their samples.

    easyvideor1 score --data SAMPLES.jsonl --responses RESPONSES.jsonl [--out FILE]

Samples are read by `data.loading.load_samples` (JSON, JSONL or Parquet; the benchmark files
as they are). Each response line is {"problem_id": ..., "response": "..."}; responses are
matched to samples by problem_id, or by line when the responses carry no ids. One
RewardResult per line goes to `--out` (default: RESPONSES.scores.jsonl), and mean reward /
accuracy / format and the error count per problem_type are printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from easyvideor1.data.loading import load_samples, read_records
from easyvideor1.records import Sample
from easyvideor1.rewards.batch import metrics_by_type, score_batch
from easyvideor1.rewards.config import RewardConfig


def read_responses(path: Path) -> list[dict]:
    """Response records of a JSONL (or JSON list) file; errors name the file and line."""
    rows = []
    for index, raw in read_records(path):
        if isinstance(raw, str):
            raise ValueError(f"{path}: {raw}")
        if not isinstance(raw, dict) or "response" not in raw:
            raise ValueError(f"{path}: record {index} needs a `response` field")
        rows.append(raw)
    return rows


def match_responses(samples: list[Sample], responses: list[dict], where: str) -> list[str]:
    """The response text for each sample, by problem_id or else by line."""
    if all("problem_id" in r for r in responses):
        by_id = {str(r["problem_id"]): str(r["response"]) for r in responses}
        if len(by_id) != len(responses):
            raise ValueError(f"{where}: duplicate problem_id values; drop the ids to match by line")
        missing = [s.problem_id for s in samples if s.problem_id not in by_id]
        if missing:
            raise ValueError(
                f"{where}: no response for problem_id {missing[:5]} ({len(missing)} missing)"
            )
        return [by_id[s.problem_id] for s in samples]
    if len(responses) != len(samples):
        raise ValueError(
            f"{where}: {len(responses)} responses without ids for {len(samples)} samples"
        )
    return [str(r["response"]) for r in responses]


def _run(args: argparse.Namespace) -> int:
    """Score, write one RewardResult per line, print metrics per problem_type."""
    samples = load_samples(args.data)
    responses_path = Path(args.responses)
    responses = match_responses(samples, read_responses(responses_path), str(responses_path))
    cfg = RewardConfig(
        think=args.think, format_weight=args.format_weight, accuracy_weight=1 - args.format_weight
    )
    results = score_batch(responses, samples, cfg, workers=args.workers, timeout_s=args.timeout)
    out = Path(args.out) if args.out else responses_path.with_suffix(".scores.jsonl")
    with out.open("w", encoding="utf-8") as f:
        for sample, result in zip(samples, results):
            row = {"problem_id": sample.problem_id, "problem_type": sample.problem_type}
            f.write(json.dumps({**row, **dataclasses.asdict(result)}, ensure_ascii=False) + "\n")
    print(f"{'problem_type':<28} {'n':>6} {'reward':>8} {'accuracy':>9} {'format':>7} {'errors':>7}")
    for name, m in metrics_by_type(results, samples).items():
        print(
            f"{name:<28} {m.count:>6} {m.reward:>8.4f} {m.accuracy:>9.4f} {m.format:>7.4f} {m.errors:>7}"
        )
    print(f"wrote {out}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    """Add the `score` subcommand."""
    p = subparsers.add_parser(
        "score",
        help="score saved model responses against samples",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", required=True, help="samples: JSON list, JSONL or Parquet")
    p.add_argument("--responses", required=True, help='JSONL of {"problem_id": ..., "response": ...}')
    p.add_argument("--out", help="where to write the results (default RESPONSES.scores.jsonl)")
    p.add_argument("--workers", type=int, default=None, help="scoring processes (0: in this process)")
    p.add_argument("--timeout", type=float, default=60.0, help="per-sample limit in seconds")
    p.add_argument("--think", choices=("required", "optional"), default="required",
                   help="whether <think> is required by the format reward")  # fmt: skip
    p.add_argument("--format-weight", type=float, default=0.1,
                   help="weight of format in overall (accuracy gets 1 - it)")  # fmt: skip
    p.set_defaults(func=_run)
