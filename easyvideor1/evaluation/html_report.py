"""One self-contained HTML page per results folder: RESULTS_DIR/report.html (+ report_files/).

    headline table and bar chart of every benchmark
    per benchmark: its metrics, a table and a bar chart per breakdown, and sample responses,
    right and wrong, each beside thumbnails of the frames the model saw (`eval --tools` rows:
    each model turn beside the frames its tool calls returned)

The frames are sampled again with the run's stored frame budget (the `vision.*` keys of
settings.json) through the same `FrameSource` the evaluation used (its cache when there is one),
so they are the frames the model saw; where the media are gone the sample says why instead. A
row's tool calls are run again the same way (on the same frames, with the visual tokens each
used), which gives the frames each call returned.
`run.json` (written by `eval` beside settings.json, not hashed) tells where the samples are.
The charts are inline SVG; the only script marks images that failed to load (and counts the
loaded ones in `body[data-images-loaded]`, which the tests read through headless Chromium).
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from easyvideor1.evaluation.adapters import get_benchmark
from easyvideor1.evaluation.aggregate import Aggregate
from easyvideor1.evaluation.bootstrap import METHOD, ScoreInterval, interval_text
from easyvideor1.evaluation.results import SETTINGS_FILE, ResultRow, read_results
from easyvideor1.vision.config import VisionConfig

log = logging.getLogger(__name__)

RUN_FILE = "run.json"  # where the samples are: {"data_root", "benchmarks": {name: spec}, "cache_dir", "cache_mode"}
FILES_DIR = "report_files"
SAMPLES_PER_KIND = 2  # right and wrong responses shown per benchmark
THUMBS = 6  # frames shown per sample, evenly spaced over those the model saw
THUMB_HEIGHT = 96
RIGHT = 0.5  # a row scoring at least this is shown as right
NO_ANSWER = "(no answer parsed)"  # shown for a response the benchmark read no answer from

_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f2f2f2}td.num{text-align:right}.note{background:#fff6d6;padding:6px 10px;border-left:4px solid #e0b000}
.sample{border:1px solid #ddd;margin:8px 0;padding:8px}.right{border-left:6px solid #3a3}.wrong{border-left:6px solid #c33}
.thumbs img{height:96px;margin-right:4px}.thumbs img.broken{outline:3px solid red}
.turn{display:flex;gap:8px}.turn pre{flex:1;margin:4px 0}.tools{flex:1}.call{margin:4px 0}
pre{white-space:pre-wrap;background:#f7f7f7;padding:6px;max-height:12em;overflow:auto}
"""
_SCRIPT = """
window.addEventListener("load", function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) {
    if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; } else { imgs[i].className += " broken"; }
  }
  document.body.setAttribute("data-images-loaded", ok + "/" + imgs.length);
});
"""


def write_run_info(out_dir: str | os.PathLike, data_root: str | None, benchmarks: dict[str, str],
                   cache_dir: str | None, cache_mode: str, shard: tuple[int, int] | None = None,
                   totals: dict[str, int] | None = None) -> None:
    """Record where a run's samples and frames are (for the HTML report's samples), and for a
    sharded run which shard it is and each benchmark's sample count over all shards (so a
    merge can tell a missing shard)."""
    info = {"data_root": os.path.abspath(data_root) if data_root else None,
            "benchmarks": {k: (os.path.abspath(v) if os.path.exists(v) else v) for k, v in benchmarks.items()},
            "cache_dir": os.path.abspath(cache_dir) if cache_dir else None, "cache_mode": cache_mode,
            "shard": list(shard) if shard else None, "totals": totals or {}}
    (Path(out_dir) / RUN_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def _e(text: Any) -> str:
    return html.escape(str(text))


def svg_bars(pairs: list[tuple[str, float]], width: int = 640, intervals: list[ScoreInterval | None] | None = None) -> str:
    """Horizontal bar chart (scores in [0, 1]) as inline SVG, on a 0-100 axis with a tick and a
    faint grid line every 20 points; `intervals` (one per bar, None or without bounds: none
    drawn) become error bars."""
    row, label_w, axis_h = 22, 220, 22
    bars_h = row * len(pairs) + 8
    scale = width - label_w - 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{bars_h + axis_h}" role="img">']
    for tick in range(0, 101, 20):
        x = label_w + tick / 100 * scale
        parts.append(f'<path class="grid" d="M{x:.1f} 0V{bars_h}" stroke="#e4e4e4"/>'
                     f'<path class="tick" d="M{x:.1f} {bars_h}v4" stroke="#444"/>'
                     f'<text class="tick" x="{x:.1f}" y="{bars_h + 16}" text-anchor="middle" font-size="11" '
                     f'fill="#444">{tick}</text>')
    parts.append(f'<path class="axis" d="M{label_w} {bars_h}H{label_w + scale}" stroke="#444"/>')
    for i, (label, value) in enumerate(pairs):
        y = 4 + i * row
        w = max(0.0, min(1.0, value)) * scale
        ci = intervals[i] if intervals else None
        end = w
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="12">{_e(label[:34])}</text>'
                     f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="#4C72B0"/>')
        if ci is not None and ci.low is not None and ci.high is not None:
            lo, hi, mid = label_w + ci.low * scale, label_w + ci.high * scale, y + row / 2
            end = max(w, ci.high * scale)
            parts.append(f'<path class="ci" d="M{lo:.1f} {mid:.1f}H{hi:.1f}M{lo:.1f} {mid - 4:.1f}V{mid + 4:.1f}'
                         f'M{hi:.1f} {mid - 4:.1f}V{mid + 4:.1f}" stroke="#222" fill="none"/>')
        parts.append(f'<text x="{label_w + end + 4:.1f}" y="{y + 15}" font-size="12">{100 * value:.1f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td{' class=num' if i else ''}>{_e(c)}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _vision(results_dir: Path) -> VisionConfig | None:
    path = results_dir / SETTINGS_FILE
    if not path.exists():
        return None
    flat = json.loads(path.read_text(encoding="utf-8"))["settings"]
    names = {f for f in VisionConfig.__dataclass_fields__}
    return VisionConfig(**{k[len("vision."):]: v for k, v in flat.items()
                           if k.startswith("vision.") and k[len("vision."):] in names})


class _Frames:
    """Thumbnails of the frames the model saw, written under report_files/ (or why not)."""

    def __init__(self, results_dir: Path, out: Path, make_source: Callable[..., Any] | None):
        self.out, self.files, self.make_source = out, out / FILES_DIR, make_source
        run_path = results_dir / RUN_FILE
        self.run = json.loads(run_path.read_text(encoding="utf-8")) if run_path.exists() else None
        self.vision = _vision(results_dir)
        self._samples: dict[str, dict[str, Any]] = {}
        self._source = None
        self._clips = None  # rollout.tools.video_tools.ClipSource, made on the first tool call shown
        self._media_memo: dict[int, list] = {}

    def samples(self, benchmark: str) -> dict[str, Any]:
        """{id: Sample} of a benchmark, or {} when its data cannot be found."""
        if benchmark not in self._samples:
            self._samples[benchmark] = {}
            if self.run is not None:
                spec = self.run["benchmarks"].get(benchmark, benchmark)
                try:
                    loaded = get_benchmark(spec).load(self.run.get("data_root"))
                    self._samples[benchmark] = {s.problem_id: s for s in loaded}
                except Exception as e:  # noqa: BLE001 - the report shows rows without their samples
                    log.warning("report: samples of %s not found (%s); shown without frames", benchmark, e)
        return self._samples[benchmark]

    def thumbnails(self, benchmark: str, sample) -> tuple[list[str], str]:
        """Relative paths of the thumbnails, or ([], why there are none)."""
        if self.make_source is None:
            return [], "frames not rendered (no frame source given to the report)"
        if sample is None or self.vision is None:
            return [], "frames unavailable: the run's samples or settings are not found"
        if not sample.videos and not sample.images:
            return [], "text-only sample"
        try:
            media = self._media(sample)
        except Exception as e:  # noqa: BLE001 - a missing video is shown as such, not a broken page
            return [], f"frames unavailable: {type(e).__name__}: {e}"
        stem = f"{_safe(benchmark)}/{_safe(sample.problem_id)}"
        return [p for m, frames in enumerate(media) for p in self._save(frames.pixels, f"{stem}_{m}")], ""

    def _media(self, sample) -> list:
        """The prompt's frames of `sample` (read once per sample)."""
        key = id(sample)
        if key not in self._media_memo:
            if self._source is None:
                cache = self.run.get("cache_dir") if self.run else None
                mode = self.run.get("cache_mode", "prefer_cache") if cache else "realtime"
                self._source = self.make_source(self.vision, cache, "prefer_cache" if mode == "cache_only" else mode)
            self._media_memo[key] = self._source.frames_for_sample(sample)
        return self._media_memo[key]

    def _save(self, pixels, stem: str) -> list[str]:
        """Up to THUMBS of `pixels` ([T, 3, H, W] uint8), evenly spaced, as jpgs; their relative paths."""
        from PIL import Image

        paths = []
        t = pixels.shape[0]
        n = min(THUMBS, t)
        picks = sorted({round(i * (t - 1) / max(1, n - 1)) for i in range(n)})  # n distinct, ends included
        for k in picks:
            image = Image.fromarray(pixels[k].permute(1, 2, 0).contiguous().numpy())
            w = max(1, round(image.width * THUMB_HEIGHT / image.height))
            rel = Path(FILES_DIR) / f"{stem}_{k}.jpg"
            (self.out / rel).parent.mkdir(parents=True, exist_ok=True)
            image.resize((w, THUMB_HEIGHT)).save(self.out / rel, quality=85)
            paths.append(rel.as_posix())
        return paths

    def tool_thumbnails(self, benchmark: str, sample, index: int, call: dict) -> tuple[list[str], str]:
        """Thumbnails of what tool call `index` of a row returned (the call run again on the
        sample's video with the visual tokens it used, which gives the same frames), or ([], why)."""
        if call.get("error"):
            return [], f"error: {call['error']}"
        if self.make_source is None or sample is None or self.vision is None:
            return [], "frames not rendered"
        from easyvideor1.models.families import get_family
        from easyvideor1.rollout.tools.protocol import ToolContext
        from easyvideor1.rollout.tools.registry import TOOLS, ParsedCall, run_call
        from easyvideor1.rollout.tools.video_tools import ClipSource

        try:
            if self._clips is None:
                self._clips = ClipSource(self.vision)
            ctx = ToolContext(sample, self._media(sample), self._clips, get_family(self.vision.family),
                              int(call.get("visual_tokens") or 0))
            output, record = run_call(ParsedCall(call["name"], call.get("arguments") or {}), TOOLS, ctx)
        except Exception as e:  # noqa: BLE001 - a missing video is shown as such, not a broken page
            return [], f"frames unavailable: {type(e).__name__}: {e}"
        if record.error is not None:
            return [], f"frames unavailable: running the call again failed ({record.error})"
        stem = f"{_safe(benchmark)}/{_safe(sample.problem_id)}_tool{index}"
        return [p for m, frames in enumerate(output.media) for p in self._save(frames.pixels, f"{stem}_{m}")], ""


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name))[:80]


def _sample_html(benchmark: str, row: ResultRow, frames: _Frames) -> str:
    sample = frames.samples(benchmark).get(row.id)
    kind = "right" if row.status == "ok" and row.score >= RIGHT else "wrong"
    thumbs, why = frames.thumbnails(benchmark, sample)
    imgs = "".join(f'<img src="{_e(p)}" alt="frame">' for p in thumbs) or f"<em>{_e(why)}</em>"
    question = _e(sample.problem) if sample is not None else "<em>question not found</em>"
    status = f"score {100 * row.score:.1f}" + (f" &middot; failed: {_e(row.reason)}" if row.status == "failed" else "")
    return (f'<div class="sample {kind}"><b>{_e(row.id)}</b> &middot; {kind} &middot; {status}'
            f'<div class="thumbs">{imgs}</div><p>{question}</p>'
            f"<p>answer: <code>{_e(row.answer)}</code> &middot; prediction: {_prediction_html(row)}</p>"
            f"{_turns_html(benchmark, row, sample, frames) if row.turns else f'<pre>{_e(row.response)}</pre>'}</div>")


def _prediction_html(row: ResultRow) -> str:
    """The answer read from the response, or a visible marker where none was (an empty code
    span reads as a rendering fault)."""
    if str(row.prediction or "").strip():
        return f"<code>{_e(row.prediction)}</code>"
    return f'<em class="no-answer">{"(none: the sample failed)" if row.status == "failed" else NO_ANSWER}</em>'


def _calls_in(text: str) -> int:
    """How many calls the tool loop read from a turn (as `registry.parse_tool_calls` counts them)."""
    closed = len(re.findall(r"<tool_call>.*?</tool_call>", text, re.S))
    return closed + (text.count("<tool_call>") > closed)


def _turns_html(benchmark: str, row: ResultRow, sample, frames: _Frames) -> str:
    """A multi-turn response (`eval --tools`): each model turn beside the frames its calls returned."""
    parts, k = [], 0
    for turn in row.turns:
        tools = []
        for _ in range(_calls_in(turn)):
            if k >= len(row.tool_calls):  # the last allowed turn's calls never ran
                break
            call = row.tool_calls[k]
            thumbs, why = frames.tool_thumbnails(benchmark, sample, k, call)
            args = json.dumps(call.get("arguments"), sort_keys=True)
            imgs = "".join(f'<img src="{_e(p)}" alt="tool frame">' for p in thumbs) or f"<em>{_e(why)}</em>"
            tools.append(f'<div class="call"><code>{_e(call.get("name"))}({_e(args)})</code> &middot; '
                         f'{int(call.get("visual_tokens") or 0)} visual tokens<div class="thumbs">{imgs}</div></div>')
            k += 1
        parts.append(f'<div class="turn"><pre>{_e(turn)}</pre><div class="tools">{"".join(tools)}</div></div>')
    return "".join(parts)


def render(results_dir: str | os.PathLike, out_dir: str | os.PathLike, model: str, settings_hash: str | None,
           aggregates: dict[str, Aggregate], titles: dict[str, str],
           make_source: Callable[..., Any] | None = None) -> str:
    """The page's HTML (thumbnails are written under `out_dir` as a side effect).
    `make_source(vision_config, cache_dir, mode)` builds the frame reader (`vision.cache.
    FrameSource`, passed in so this module does not import torch); None: no thumbnails."""
    root, out = Path(results_dir), Path(out_dir)
    shutil.rmtree(out / FILES_DIR, ignore_errors=True)  # thumbnails of an earlier report
    rows = read_results(root)
    frames = _Frames(root, out, make_source)
    body = [f"<h1>Evaluation: {_e(model)}</h1>",
            f"<p>Results: <code>{_e(root)}</code>" + (f" (settings hash <code>{_e(settings_hash)}</code>)"
                                                      if settings_hash else "") + "</p>",
            _table(["Benchmark", "Score", "Metric", "Samples", "Failed", "95% CI", "Clusters"],
                   [[titles[k], f"{100 * a.overall:.1f}", a.metric, str(a.count), str(a.failed), interval_text(a.ci),
                     str(a.ci.clusters) if a.ci and a.ci.clusters else "-"] for k, a in aggregates.items()]),
            f"<p>95% CI: {_e(METHOD)}; a cluster is one video. Error bars: the 95% CI.</p>",
            svg_bars([(titles[k], a.overall) for k, a in aggregates.items()],
                     intervals=[a.ci for a in aggregates.values()])]
    for key, agg in aggregates.items():
        body += [f'<h2 id="{_e(key)}">{_e(titles[key])}</h2>',
                 f"<p>{_e(agg.metric)}: <b>{100 * agg.overall:.1f}</b> (95% CI {_e(interval_text(agg.ci))}) "
                 f"over {agg.count} samples ({agg.failed} failed)</p>"]
        body += [f'<p class="note">{_e(n)}</p>' for n in agg.notes]
        if agg.metrics:
            body.append(_table(["Metric", "Score"], [[k, f"{100 * v:.1f}"] for k, v in agg.metrics.items()]))
        for name, table in agg.categories.items():
            if not table:
                continue
            body += [f"<h3>by {_e(name)}</h3>",
                     _table([name, "Score", "Samples", "Failed", "95% CI"],
                            [[label, f"{100 * c.score:.1f}", str(c.count), str(c.failed), interval_text(c.ci)]
                             for label, c in table.items()]),
                     svg_bars([(label, c.score) for label, c in table.items()],
                              intervals=[c.ci for c in table.values()])]
        bench_rows = rows.get(key, [])
        right = [r for r in bench_rows if r.status == "ok" and r.score >= RIGHT][:SAMPLES_PER_KIND]
        wrong = [r for r in bench_rows if not (r.status == "ok" and r.score >= RIGHT)][:SAMPLES_PER_KIND]
        if right or wrong:
            body.append("<h3>Sample responses</h3>")
            body += [_sample_html(key, r, frames) for r in right + wrong]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Evaluation: {_e(model)}</title><style>{_STYLE}</style></head><body>"
            + "\n".join(body) + f"<script>{_SCRIPT}</script></body></html>\n")
