"""`easyvideor1 report`: Markdown tables per benchmark and category, JSON, bar chart; and
`--compare` deltas between two models (through the subcommand's own argparse registration)."""

from __future__ import annotations

import argparse
import json

import pytest
from evalfixtures import answer, mc

from easyvideor1.cli import main
from easyvideor1.evaluation import commands, presets
from easyvideor1.evaluation.adapters import BENCHMARKS
from easyvideor1.evaluation.results import ResultStore

OPTS = ["A. cat", "B. dog"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def data_root(tmp_path, write_json):
    durations = ["short", "short", "long", "long"]
    write_json("data/videomme.json", [mc(i, f"q{i}", OPTS, "A", duration=d, domain="Sports", task_type="OCR")
                                      for i, d in enumerate(durations)])
    truth = '<answer>{"time": [0, 10]}</answer>'
    write_json("data/charades_sta.json", [{"problem_id": i, "problem": "door opens", "problem_type": "temporal grounding",
                                           "path": f"{i}.mp4", "solution": truth} for i in range(2)])
    return tmp_path / "data"


def run_eval(out, data_root, model, videomme_letters, charades_preds, preset="qwen3_vl"):
    """Stand-in for the eval pipeline: fixed responses written through the results store."""
    settings = presets.settings(preset, model)
    for name, responses in (("videomme", [answer(x) for x in videomme_letters]),
                            ("charades_sta", [answer(p) for p in charades_preds])):
        bench = BENCHMARKS[name]
        with ResultStore.open(out, name, settings) as store:
            samples = bench.load(data_root)
            for s, r in zip(samples, responses):
                store.append(bench.result_row(s, r))
            for s in samples[len(responses):]:
                store.append(bench.failed_row(s, "video file is corrupt"))


def cli(argv):
    parser = argparse.ArgumentParser(prog="easyvideor1")
    commands.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_report_tables_json_and_chart(tmp_path, data_root, capsys):
    out = tmp_path / "rl"
    # Video-MME: short A, A (2/2); long B + one failed (0/2) -> 50.0. Charades: IoU 1 and 5/15.
    run_eval(out, data_root, "models/rl", ["A", "A", "B"], ["[0, 10]", "[5, 15]"])
    assert cli(["report", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "| Video-MME | 50.0 | accuracy | 4 | 1 |" in md
    assert "| Charades-STA | 66.7 | mIoU | 2 | 0 |" in md
    assert "| short | 100.0 | 2 | 0 |" in md and "| long | 0.0 | 2 | 1 |" in md
    assert "| R@0.5 | 50.0 |" in md
    assert "| Video-MME | 50.0 |" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["model"] == "rl" and report["benchmarks"]["videomme"]["failed"] == 1
    assert report["benchmarks"]["charades_sta"]["metrics"]["R@0.3"] == pytest.approx(1.0)
    assert (out / "report.png").read_bytes().startswith(PNG)


def test_compare_deltas_and_refusal(tmp_path, data_root, capsys):
    base, rl, greedy = tmp_path / "base", tmp_path / "rl", tmp_path / "greedy"
    run_eval(base, data_root, "models/base", ["B", "A", "B", "B"], ["[5, 15]", "[20, 30]"])
    run_eval(rl, data_root, "models/rl", ["A", "A", "A", "B"], ["[0, 10]", "[5, 15]"])
    assert cli(["report", str(rl), "--compare", str(base)]) == 0
    md = (rl / "compare.md").read_text()
    # Video-MME 25.0 -> 75.0; Charades mIoU (1/3 + 0)/2 = 16.7 -> (1 + 1/3)/2 = 66.7
    assert "| Benchmark | base | rl | Δ |" in md
    assert "| Video-MME | 25.0 | 75.0 | +50.0 |" in md and md.index("Video-MME") < md.index("Charades")
    assert "| Charades-STA | 16.7 | 66.7 | +50.0 |" in md
    assert "| **Average** | 20.8 | 70.8 | +50.0 |" in md
    data = json.loads((rl / "compare.json").read_text())
    short = next(d for d in data["categories"] if d["title"] == "Video-MME / duration=short")
    assert (short["other"], short["this"], short["delta"]) == pytest.approx((0.5, 1.0, 0.5))
    assert (rl / "compare.png").read_bytes().startswith(PNG)
    capsys.readouterr()
    run_eval(greedy, data_root, "models/rl", ["A"] * 4, ["[0, 10]"] * 2, preset="qwen3_vl_greedy")
    assert main(["report", str(greedy), "--compare", str(base)]) == 2
    err = capsys.readouterr().err
    assert "not comparable" in err and "sampling.temperature: 0.0 != 0.7" in err


def test_report_of_a_folder_without_results_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no settings.json, so it is not a results folder" in capsys.readouterr().err
    (tmp_path / "settings.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no <benchmark>.jsonl" in capsys.readouterr().err
