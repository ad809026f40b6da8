"""report.html in headless Chromium: it renders, every frame thumbnail loads, the console stays
silent; it holds every benchmark's table and chart and right and wrong responses beside the
frames the model saw (sampled again with the run's stored budget). Without a browser: the charts'
0-100 axis, and the marker shown for a response without an answer."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from xml.etree import ElementTree

import pytest
from evalfixtures import mc

from easyvideor1.data.synth import write_suite
from easyvideor1.evaluation import presets
from easyvideor1.evaluation.adapters import get_benchmark
from easyvideor1.evaluation.bootstrap import ScoreInterval
from easyvideor1.evaluation.html_report import NO_ANSWER, svg_bars, write_run_info
from easyvideor1.evaluation.report import write_report
from easyvideor1.evaluation.results import ResultStore
from easyvideor1.models.families import get_family
from easyvideor1.rollout.tools.protocol import ToolContext
from easyvideor1.rollout.tools.registry import TOOLS, ParsedCall, run_call
from easyvideor1.rollout.tools.video_tools import ClipSource
from easyvideor1.vision.cache import FrameSource
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
TIMEOUT_S = 300  # ends a hang; the page renders in about a second


def _dump_dom(page, work):
    cmd = [CHROMIUM, "--headless", "--disable-gpu", "--no-first-run", "--disable-extensions",
           "--disable-dev-shm-usage", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
           f"--user-data-dir={work / 'profile'}", "--dump-dom", page.as_uri()]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")
    env = {**os.environ, "HOME": str(work), "DBUS_SESSION_BUS_ADDRESS": "disabled:"}
    return forkserver.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, check=False)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install -y chromium)")
def test_html_report_renders_with_frames_in_chromium(tmp_path):
    data = write_suite(tmp_path / "data", num_train=0, num_val=6, seed=4)["val"]
    out = tmp_path / "run"
    settings = presets.settings("qwen2_5_vl_greedy", "models/tiny", "hf", overrides=presets.Overrides(
        fps=1.0, max_frames=4, video_max_pixels=12544, image_max_pixels=12544))
    bench = get_benchmark(str(data))
    samples = bench.load()
    with ResultStore.open(out, bench.name, settings) as store:
        # the failed row first, so it is one of the two wrong rows the page shows
        store.append(bench.failed_row(samples[0], "generation failed: <timeout> & more"))
        for i, s in enumerate(samples[1:]):
            store.append(bench.result_row(s, s.offline_output if i % 2 == 0 else "<answer>Z</answer>"))
    write_run_info(out, None, {bench.name: str(data)}, None, "realtime")
    paths = write_report(out, make_source=FrameSource)
    page = out / "report.html"
    assert page in paths

    text = page.read_text()
    shown = re.findall(r'<div class="sample (right|wrong)"><b>([^<]+)</b>', text)
    assert [k for k, _ in shown] == ["right", "right", "wrong", "wrong"]  # two of each, right first
    assert shown[2][1] == samples[0].problem_id  # the failed row is shown, its reason escaped
    assert "failed: generation failed: &lt;timeout&gt; &amp; more" in text and "<timeout>" not in text
    thumbs = re.findall(r'<img src="([^"]+)"', text)
    expected = 0
    for _, sid in shown:
        media = FrameSource(settings.vision).frames_for_sample(next(s for s in samples if s.problem_id == sid))
        expected += sum(min(6, m.pixels.shape[0]) for m in media)
    assert len(thumbs) == expected > 0 and all((out / t).is_file() for t in thumbs)
    assert text.count("<svg") == 1 + sum(1 for t in json.loads((out / "report.json").read_text())["benchmarks"]
                                         ["file-val"]["categories"].values() if t)

    proc = _dump_dom(page, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f'data-images-loaded="{expected}/{expected}"' in proc.stdout  # every thumbnail decoded
    assert "CONSOLE" not in proc.stderr, proc.stderr  # no script errors or messages
    assert "Evaluation: tiny" in proc.stdout and "file-val" in proc.stdout


def test_html_report_shows_the_frames_each_tool_call_returned(tmp_path):
    """An `eval --tools` row: each model turn is shown beside the frames its calls returned (the
    call run again on the sample's video), an erroring call beside its error, all escaped."""
    data = write_suite(tmp_path / "data", num_train=0, num_val=1, tasks=("flash",))["val"]
    out = tmp_path / "run"
    settings = presets.settings("qwen2_5_vl_greedy", "models/tiny", "hf", overrides=presets.Overrides(
        fps=1.0, max_frames=4, video_max_pixels=3136, image_max_pixels=3136))
    bench = get_benchmark(str(data))
    (sample,) = bench.load()
    family = get_family(settings.vision.family)
    ctx = ToolContext(sample, FrameSource(settings.vision).frames_for_sample(sample), ClipSource(settings.vision),
                      family, 64)
    call = ParsedCall("crop_video", {"start": 2.0, "end": 3.0})
    output, record = run_call(call, TOOLS, ctx)
    clip_frames = output.media[0].pixels.shape[0]
    assert record.error is None and clip_frames > 4  # more frames than the prompt's 4
    turns = ['<tool_call>\n{"name": "crop_video", "arguments": {"start": 2.0, "end": 3.0}}\n</tool_call>',
             '<tool_call>{"name": "crop"}</tool_call> <b>bold</b>', "<answer>red</answer>"]
    calls = [dataclasses.asdict(record), {"name": "crop", "arguments": {}, "error": "unknown tool 'crop'",
                                          "visual_tokens": 0}]
    row = dataclasses.replace(bench.result_row(sample, turns[-1]), turns=turns, tool_calls=calls)
    with ResultStore.open(out, bench.name, settings) as store:
        store.append(row)
    write_run_info(out, None, {bench.name: str(data)}, None, "realtime")
    write_report(out, make_source=FrameSource)
    text = (out / "report.html").read_text()
    tool_thumbs = re.findall(r'<img src="([^"]+)" alt="tool frame">', text)
    assert len(tool_thumbs) == min(6, clip_frames) and all((out / t).is_file() for t in tool_thumbs)
    assert all("_tool0_" in t for t in tool_thumbs)
    assert text.count('<div class="turn">') == 3 and "&lt;b&gt;bold&lt;/b&gt;" in text and "<b>bold" not in text
    assert "error: unknown tool &#x27;crop&#x27;" in text
    assert f"{record.visual_tokens} visual tokens" in text


def test_bar_chart_has_a_0_to_100_axis():
    svg = ElementTree.fromstring(svg_bars([("Video-MME", 0.5), ("MVBench", 1.0)],
                                          intervals=[ScoreInterval(0.0, 0.7, 12, 12), None]))
    ns = "{http://www.w3.org/2000/svg}"
    ticks = [t for t in svg.iter(f"{ns}text") if t.get("class") == "tick"]
    assert [t.text for t in ticks] == ["0", "20", "40", "60", "80", "100"]
    x0, x100 = float(ticks[0].get("x")), float(ticks[-1].get("x"))
    half, full = (float(r.get("width")) for r in svg.iter(f"{ns}rect"))
    assert full == pytest.approx(x100 - x0) and half == pytest.approx((x100 - x0) / 2)  # bars on the axis' scale
    assert [p for p in svg.iter(f"{ns}path") if p.get("class") == "axis"]
    assert max(float(t.get("y")) for t in ticks) < float(svg.get("height"))  # the labels fit in the picture


def test_a_response_without_an_answer_says_so(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "videomme.json").write_text(json.dumps([mc(i, f"q{i}", ["A. cat", "B. dog"], "A") for i in range(3)]))
    bench = get_benchmark("videomme")
    samples = bench.load(data)
    out = tmp_path / "run"
    with ResultStore.open(out, bench.name, presets.settings("qwen3_vl", "models/m")) as store:
        store.append(bench.result_row(samples[0], "<answer>A</answer>"))
        store.append(bench.result_row(samples[1], "<think>it could be either</think>"))  # no answer in it
        store.append(bench.failed_row(samples[2], "video file is corrupt"))
    write_report(out)
    text = (out / "report.html").read_text()
    predictions = re.findall(r"prediction: (.*?)</p>", text)
    assert predictions == ["<code>A</code>", f'<em class="no-answer">{NO_ANSWER}</em>',
                           '<em class="no-answer">(none: the sample failed)</em>'], predictions
