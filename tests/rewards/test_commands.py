"""The `score` subcommand, driven through a tiny argparse as cli.py will wire it."""

import argparse
import json

import pytest

from easyvideor1.rewards import commands
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="easyvideor1")
    commands.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SAMPLES = [
    {"problem_id": "1", "problem": "Which?", "problem_type": "multiple choice", "options": "['A. cat', 'B. dog']",
     "solution": "<answer>B</answer>", "answer": "dog", "data_type": "video", "path": "./v.mp4"},
    {"problem_id": "2", "problem": "How many?", "problem_type": "numerical", "solution": "<answer>3</answer>"},
    {"problem_id": "3", "problem": "When?", "problem_type": "temporal grounding", "solution": "[0, 10]"},
]  # fmt: skip


def test_score_by_problem_id(tmp_path, capsys):
    data = write_jsonl(tmp_path / "samples.jsonl", SAMPLES)
    responses = write_jsonl(tmp_path / "responses.jsonl", [
        {"problem_id": "3", "response": "<think>.</think><answer>[0, 5]</answer>"},
        {"problem_id": "1", "response": "<think>.</think><answer>B</answer>"},
        {"problem_id": "2", "response": "<think>.</think><answer>4</answer>"},
    ])  # fmt: skip
    out = tmp_path / "scores.jsonl"
    assert (
        run_cli(
            [
                "score",
                "--data",
                str(data),
                "--responses",
                str(responses),
                "--out",
                str(out),
                "--workers",
                "0",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["problem_id"] for r in rows] == ["1", "2", "3"]
    assert [r["accuracy"] for r in rows] == [1.0, 0.0, 0.5]
    assert rows[0]["overall"] == pytest.approx(1.0) and rows[0]["error"] is None
    printed = capsys.readouterr().out
    assert "multiple choice" in printed and "temporal grounding" in printed
    all_line = next(line for line in printed.splitlines() if line.startswith("all "))
    assert all_line.split()[1:] == [
        "3",
        f"{(1.0 + 0.1 + 0.55) / 3:.4f}",
        f"{1.5 / 3:.4f}",
        "1.0000",
        "0",
    ]


def test_score_by_line_and_default_out(tmp_path):
    data = tmp_path / "samples.json"
    data.write_text(json.dumps(SAMPLES))  # a JSON list, like the benchmark files
    responses = write_jsonl(
        tmp_path / "model.jsonl",
        [{"response": "B"}, {"response": "three"}, {"response": "[0, 10]"}],
    )
    assert (
        run_cli(["score", "--data", str(data), "--responses", str(responses), "--workers", "1"])
        == 0
    )
    rows = [json.loads(line) for line in (tmp_path / "model.scores.jsonl").read_text().splitlines()]
    assert [r["accuracy"] for r in rows] == [1.0, 1.0, 1.0] and all(
        r["format"] == 0.0 for r in rows
    )


def test_clear_errors(tmp_path):
    data = write_jsonl(tmp_path / "samples.jsonl", SAMPLES)
    missing = write_jsonl(tmp_path / "r1.jsonl", [{"problem_id": "1", "response": "B"}])
    with pytest.raises(ValueError, match=r"no response for problem_id \['2', '3'\]"):
        run_cli(["score", "--data", str(data), "--responses", str(missing), "--workers", "0"])
    short = write_jsonl(tmp_path / "r2.jsonl", [{"response": "B"}])
    with pytest.raises(ValueError, match="1 responses without ids for 3 samples"):
        run_cli(["score", "--data", str(data), "--responses", str(short), "--workers", "0"])
    broken = tmp_path / "r3.jsonl"
    broken.write_text('{"response": "B"}\nnot json\n')
    with pytest.raises(ValueError, match="r3.jsonl: line 2 is not valid JSON"):
        run_cli(["score", "--data", str(data), "--responses", str(broken), "--workers", "0"])
    # An unknown problem_type is that record's error (the others are scored; exit status 1).
    unknown = write_jsonl(tmp_path / "s2.jsonl", [{"problem": "q", "problem_type": "haiku", "solution": "x"},
                                                  {"problem": "q", "problem_type": "numerical", "solution": "4"}])
    two = write_jsonl(tmp_path / "r4.jsonl", [{"response": "B"}, {"response": "<think>.</think><answer>4</answer>"}])
    assert run_cli(["score", "--data", str(unknown), "--responses", str(two), "--workers", "0"]) == 1
    rows = [json.loads(line) for line in (tmp_path / "r4.scores.jsonl").read_text().splitlines()]
    assert rows[0]["problem_id"] == "1" and rows[0]["accuracy"] == 1.0
    assert rows[1]["problem_id"] == "0" and "haiku" in rows[1]["error"]


def test_real_entry_point_in_a_subprocess(tmp_path):
    import subprocess
    import sys

    data = write_jsonl(tmp_path / "samples.jsonl", SAMPLES)
    responses = write_jsonl(tmp_path / "r.jsonl", [{"response": "<think>.</think><answer>B</answer>"},
                                                   {"response": "3"}, {"response": "[0, 10]"}])  # fmt: skip
    done = forkserver.run(
        [sys.executable, "-m", "easyvideor1.cli", "score", "--data", str(data), "--responses", str(responses),
         "--workers", "1", "--timeout", "30"],
        capture_output=True, text=True, timeout=600,  # ends a hang only
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "numerical" in done.stdout and "r.scores.jsonl" in done.stderr
    rows = [json.loads(line) for line in (tmp_path / "r.scores.jsonl").read_text().splitlines()]
    assert [r["accuracy"] for r in rows] == [1.0, 1.0, 1.0] and rows[0]["overall"] == 1.0
