"""`easyvideor1 report`: Markdown tables per benchmark and category, JSON, bar chart; and
`--compare` deltas between two models (through the subcommand's own argparse registration)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from evalfixtures import answer, mc

from easyvideor1.cli import main
from easyvideor1.evaluation import commands, presets
from easyvideor1.evaluation.adapters import BENCHMARKS
from easyvideor1.evaluation.results import ResultStore
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

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
    assert "| Benchmark | rl | base | Δ |" in md  # A (RESULTS_DIR) first, named by its folder
    assert "| Video-MME | 75.0 | 25.0 | +50.0 |" in md and md.index("Video-MME") < md.index("Charades")
    assert "| Charades-STA | 66.7 | 16.7 | +50.0 |" in md
    assert "| **Average** | 70.8 | 20.8 | +50.0 |" in md
    data = json.loads((rl / "compare.json").read_text())
    short = next(d for d in data["categories"] if d["title"] == "Video-MME / duration=short")
    assert (short["other"], short["this"], short["delta"]) == pytest.approx((0.5, 1.0, 0.5))
    assert (rl / "compare.png").read_bytes().startswith(PNG)
    capsys.readouterr()
    run_eval(greedy, data_root, "models/rl", ["A"] * 4, ["[0, 10]"] * 2, preset="qwen3_vl_greedy")
    assert main(["report", str(greedy), "--compare", str(base)]) == 2
    err = capsys.readouterr().err
    assert "not comparable" in err and "sampling.temperature: 0.0 != 0.7" in err


@pytest.fixture
def video_root(tmp_path, write_json):
    """45 Video-MME questions on 15 videos (3 each), 12 Charades-STA queries on 12 videos."""
    write_json("many/videomme.json", [mc(i, f"q{i}", OPTS, "A", path=f"./videos/v{i // 3}.mp4",
                                         duration=("short", "long")[i % 2]) for i in range(45)])
    truth = '<answer>{"time": [0, 10]}</answer>'
    write_json("many/charades_sta.json", [{"problem_id": i, "problem": "door opens", "path": f"c{i}.mp4",
                                           "problem_type": "temporal grounding", "solution": truth} for i in range(12)])
    return tmp_path / "many"


def test_intervals_and_paired_verdicts_through_the_cli(tmp_path, video_root, capsys):
    base, rl = tmp_path / "base", tmp_path / "rl"
    moments = [f"[{i % 4}, 10]" for i in range(12)]  # the same predictions in both runs: IoU 1, .9, .8, .7
    run_eval(base, video_root, "models/base", ["A" if i % 4 == 0 else "B" for i in range(45)], moments)  # 26.7
    run_eval(rl, video_root, "models/rl", ["A" if i % 4 != 3 else "B" for i in range(45)], moments)  # 75.6
    assert cli(["report", str(rl)]) == 0
    md = (rl / "report.md").read_text()
    row = re.search(r"\| Video-MME \| 75\.6 \| accuracy \| 45 \| 0 \| (\d+\.\d)–(\d+\.\d) \| 15 \|", md)
    assert row and float(row[1]) < 75.6 < float(row[2]), md
    assert "cluster bootstrap by video" in md and "| short | " in md
    report = json.loads((rl / "report.json").read_text())
    ci = report["benchmarks"]["videomme"]["ci"]
    assert (ci["clusters"], ci["units"]) == (15, 45) and ci["low"] < 34 / 45 < ci["high"]
    assert report["benchmarks"]["videomme"]["categories"]["duration"]["long"]["ci"]["units"] == 22
    assert report["benchmarks"]["charades_sta"]["ci"]["clusters"] == 12 and report["intervals"]["level"] == 0.95
    page = (rl / "report.html").read_text()
    assert f"{100 * ci['low']:.1f}–{100 * ci['high']:.1f}" in page and '<path class="ci"' in page
    capsys.readouterr()

    # the real command line, in a process of its own
    proc = forkserver.run([sys.executable, "-c", "import sys; from easyvideor1.cli import main; sys.exit(main())",
                           "report", str(rl), "--compare", str(base)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = proc.stdout
    verdict = r"\| Video-MME \| 75\.6 \| 26\.7 \| \+48\.9 \| \+\d+\.\d to \+\d+\.\d \| 0\.0\d\d \| rl better \|"
    assert re.search(verdict, md), md
    assert "| Charades-STA | 85.0 | 85.0 | +0.0 | +0.0 to +0.0 | 1.000 | no significant difference |" in md
    data = json.loads((rl / "compare.json").read_text())
    test = data["benchmarks"][0]["test"]
    assert (test["verdict"], test["shared"], test["clusters"]) == ("A better", 45, 15) and test["p_value"] < 0.05
    assert test["low"] > 0 and test["delta"] == pytest.approx(22 / 45)
    assert cli(["report", str(base), "--compare", str(rl), "--out", str(tmp_path / "swapped")]) == 0
    assert "| -48.9 |" in capsys.readouterr().out and "rl better" in (tmp_path / "swapped" / "compare.md").read_text()


def test_report_of_a_folder_without_results_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no settings.json, so it is not a results folder" in capsys.readouterr().err
    (tmp_path / "settings.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no <benchmark>.jsonl" in capsys.readouterr().err


def test_intervals_near_0_and_100_stay_within_the_scale(tmp_path, video_root, capsys):
    low, high = tmp_path / "low", tmp_path / "high"
    # Video-MME 1/45 and 44/45 right; Charades-STA one IoU of 1 among 12 zeros, and 11 ones and one 0.9
    run_eval(low, video_root, "models/low", ["A" if i == 0 else "B" for i in range(45)],
             ["[0, 10]"] + ["[20, 30]"] * 11)
    run_eval(high, video_root, "models/high", ["B" if i == 0 else "A" for i in range(45)],
             ["[1, 10]"] + ["[0, 10]"] * 11)
    for run in (low, high):
        assert cli(["report", str(run)]) == 0
        md, page = (run / "report.md").read_text(), (run / "report.html").read_text()
        report = json.loads((run / "report.json").read_text())
        for key, bench in report["benchmarks"].items():
            cells = [c for table in bench["categories"].values() for c in table.values()]
            for ci in [bench["ci"], *(c["ci"] for c in cells)]:
                if ci["low"] is not None:
                    assert 0.0 <= ci["low"] <= ci["high"] <= 1.0, (run.name, key, ci)
            text = f"{100 * bench['ci']['low']:.1f}–{100 * bench['ci']['high']:.1f}"
            assert f"| {text} |" in md and text in page, (text, md)  # every output gives the same bounds
    lows = json.loads((low / "report.json").read_text())["benchmarks"]
    highs = json.loads((high / "report.json").read_text())["benchmarks"]
    assert lows["videomme"]["ci"]["low"] == 0.0 and highs["videomme"]["ci"]["high"] == 1.0  # clipped, not beyond
    assert "| Video-MME | 2.2 | accuracy | 45 | 0 | 0.0–" in (low / "report.md").read_text()
    capsys.readouterr()
    assert cli(["report", str(high), "--compare", str(low), "--out", str(tmp_path / "cmp")]) == 0
    for row in json.loads((tmp_path / "cmp" / "compare.json").read_text())["benchmarks"]:
        test = row["test"]
        assert -1.0 <= test["low"] <= test["delta"] <= test["high"] <= 1.0, row


def test_compare_labels_order_and_chart(tmp_path, data_root, capsys):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from easyvideor1.evaluation.compare import benchmark_deltas, compare_chart, default_labels
    from easyvideor1.evaluation.report import summarize_run

    base, rl = tmp_path / "b" / "eval", tmp_path / "a" / "eval"
    run_eval(base, data_root, "models/hf_model", ["B", "B", "B", "B"], ["[5, 15]", "[20, 30]"])  # Video-MME 0.0
    run_eval(rl, data_root, "models/model", ["A", "A", "A", "B"], ["[0, 10]", "[5, 15]"])
    assert default_labels(rl, base) == ("a/eval", "b/eval")  # equal folder names: their parents tell them apart
    assert default_labels(tmp_path / "eval-trained", base) == ("eval-trained", "eval")
    assert cli(["report", str(rl), "--compare", str(base)]) == 0
    assert "| Benchmark | a/eval | b/eval | Δ |" in (rl / "compare.md").read_text()

    assert cli(["report", str(rl), "--compare", str(base), "--label", "trained", "base"]) == 0
    md = (rl / "compare.md").read_text()
    assert md.startswith("# trained vs base") and "| Benchmark | trained | base | Δ |" in md
    assert "| Video-MME | 75.0 | 0.0 | +75.0 |" in md
    data = json.loads((rl / "compare.json").read_text())
    assert (data["this"]["label"], data["other"]["label"]) == ("trained", "base")
    assert data["this"]["model"] == "model" and data["other"]["model"] == "hf_model"

    capsys.readouterr()
    assert main(["report", str(rl), "--label", "trained", "base"]) == 2
    err = capsys.readouterr().err
    assert "--label trained base: names the two runs of a comparison; give --compare OTHER_DIR" in err
    assert len(err.strip().splitlines()) == 1, err
    assert main(["report", str(rl), "--compare", str(base), "--label", "x", "x"]) == 2
    assert "two different, non-empty names" in capsys.readouterr().err

    this, other = summarize_run(rl), summarize_run(base)
    deltas = benchmark_deltas(this, other)
    fig = compare_chart(this, other, deltas, tmp_path / "c.png", ("trained", "base"))
    assert (tmp_path / "c.png").read_bytes().startswith(PNG)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["A: trained", "B: base"]
    assert list(ax.get_yticks()) == [0, 20, 40, 60, 80, 100] and ax.get_ylim()[0] == 0
    from matplotlib.container import BarContainer

    a_bars, b_bars = (c.patches for c in ax.containers if isinstance(c, BarContainer))
    assert [round(p.get_height(), 1) for p in a_bars] == [75.0, 66.7]  # A's bars on the left of each pair
    assert [round(p.get_height(), 1) for p in b_bars] == [0.0, 16.7]
    assert a_bars[0].get_x() < b_bars[0].get_x()
    # B's Video-MME bar at 0: a mark on the axis across its width, and its value written
    marks = [c for c in ax.collections if c.get_gid() == "zero-mark"]
    assert len(marks) == 1
    (seg,) = marks[0].get_segments()
    assert seg[:, 1].tolist() == [0, 0]
    assert seg[:, 0].tolist() == pytest.approx([b_bars[0].get_x(), b_bars[0].get_x() + b_bars[0].get_width()])
    assert "0.0" in [t.get_text() for t in ax.texts]
    # each delta sits above everything of its pair (bars, error bars, value labels), over the pair's middle
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    deltas_drawn = [t for t in ax.texts if t.get_gid() == "delta"]
    assert [t.get_text() for t in deltas_drawn] == ["+75.0", "+50.0"]
    values = [t for t in ax.texts if t.get_gid() != "delta"]
    for k, text in enumerate(deltas_drawn):
        box = text.get_window_extent(renderer)
        pair = [a_bars[k], b_bars[k]]
        below = [p.get_window_extent(renderer) for p in pair]
        below += [v.get_window_extent(renderer) for v in values
                  if pair[0].get_x() <= v.xy[0] <= pair[1].get_x() + pair[1].get_width()]
        assert all(box.y0 > b.y1 for b in below), (text.get_text(), box, below)
        assert below[0].x0 < (box.x0 + box.x1) / 2 < below[1].x1
        assert abs((box.x0 + box.x1) / 2 - (below[0].x1 + below[1].x0) / 2) < 2  # centred on the pair
