"""The `easyvideor1 score` command: score saved model outputs against their samples.

    easyvideor1 score --data SAMPLES.jsonl --responses RESPONSES.jsonl [--out FILE]

Samples are read by `data.loading.load_records` (JSON, JSONL or Parquet; the benchmark files
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

from easyvideor1 import arguments
from easyvideor1.data.loading import LoadResult, load_records, read_records
from easyvideor1.errors import UserError
from easyvideor1.records import Sample
from easyvideor1.rewards.batch import metrics_by_type, score_batch
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.dispatch import canonical_type


class ResponsesError(UserError, ValueError):
    """A responses file that cannot be matched to its samples."""


def read_responses(path: Path) -> list[dict]:
    """Response records of a JSONL (or JSON list) file; errors name the file and line."""
    rows = []
    for index, raw in read_records(path):
        if isinstance(raw, str):
            raise ResponsesError(f"{path}: {raw}")
        if not isinstance(raw, dict) or "response" not in raw:
            raise ResponsesError(f"{path}: record {index} needs a `response` field")
        rows.append(raw)
    return rows


def match_responses(samples: list[Sample], responses: list[dict], where: str) -> list[str]:
    """The response text for each sample, by problem_id or else by line."""
    if all("problem_id" in r for r in responses):
        by_id = {str(r["problem_id"]): str(r["response"]) for r in responses}
        if len(by_id) != len(responses):
            raise ResponsesError(f"{where}: duplicate problem_id values; drop the ids to match by line")
        missing = [s.problem_id for s in samples if s.problem_id not in by_id]
        if missing:
            raise ResponsesError(
                f"{where}: no response for problem_id {missing[:5]} ({len(missing)} missing)"
            )
        return [by_id[s.problem_id] for s in samples]
    if len(responses) != len(samples):
        raise ResponsesError(
            f"{where}: {len(responses)} responses without ids for {len(samples)} samples"
        )
    return [str(r["response"]) for r in responses]


def _run(args: argparse.Namespace) -> int:
    """Score, write one RewardResult per line, print metrics per problem_type. A bad record (or
    one of an unknown problem_type) gets a line with its error instead; the others are scored."""
    arguments.input_file("--data", args.data)
    arguments.input_file("--responses", args.responses, 'a JSONL file of {"problem_id": ..., "response": ...}',
                         (".jsonl", ".json"))
    out = Path(args.out) if args.out else Path(args.responses).with_suffix(".scores.jsonl")
    arguments.output_file("--out", str(out))
    arguments.at_least(0, workers=args.workers)
    arguments.above(0, timeout=args.timeout)
    arguments.within(0, 1, format_weight=args.format_weight)
    loaded = load_records(args.data)
    responses_path = Path(args.responses)
    # Matched before any record is set aside, so that matching by line keeps its alignment.
    texts = match_responses(loaded.samples, read_responses(responses_path), str(responses_path))
    samples, responses, bad = _scorable(args.data, loaded, texts)
    cfg = RewardConfig(
        think=args.think, format_weight=args.format_weight, accuracy_weight=1 - args.format_weight
    )
    results = score_batch(responses, samples, cfg, workers=args.workers, timeout_s=args.timeout)
    with out.open("w", encoding="utf-8") as f:
        for sample, result in zip(samples, results):
            row = {"problem_id": sample.problem_id, "problem_type": sample.problem_type}
            f.write(json.dumps({**row, **dataclasses.asdict(result)}, ensure_ascii=False) + "\n")
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in bad)
    for row in bad:
        print(f"not scored: {row['error']}", file=sys.stderr)
    print(f"{'problem_type':<28} {'n':>6} {'reward':>8} {'accuracy':>9} {'format':>7} {'errors':>7}")
    for name, m in metrics_by_type(results, samples).items():
        print(
            f"{name:<28} {m.count:>6} {m.reward:>8.4f} {m.accuracy:>9.4f} {m.format:>7.4f} {m.errors:>7}"
        )
    print(f"wrote {out}" + (f" ({len(bad)} bad records not scored, listed above)" if bad else ""), file=sys.stderr)
    return 1 if bad else 0


def _scorable(path: str, loaded: LoadResult, texts: list[str]) -> tuple[list[Sample], list[str], list[dict]]:
    """The scorable samples and their responses, and an error row for each record that is not
    (a bad record, an unknown problem_type)."""
    bad = [{"problem_id": p.problem_id or f"record-{p.index}",
            "error": f"bad record: {p} (fix it; `easyvideor1 check-data {path}` lists them all)"}
           for p in loaded.problems]
    samples, responses = [], []
    for sample, text in zip(loaded.samples, texts):
        try:
            canonical_type(sample.problem_type)
        except ValueError as e:
            bad.append({"problem_id": sample.problem_id, "problem_type": sample.problem_type,
                        "error": f"sample {sample.problem_id!r}: {e}"})
            continue
        samples.append(sample)
        responses.append(text)
    return samples, responses, bad


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
