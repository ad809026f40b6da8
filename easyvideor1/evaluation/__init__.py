"""Evaluation on video benchmarks: adapters, results store, settings, presets, reports.

- `adapters`: the registry (`BENCHMARKS`, `get_benchmark`) of thin per-benchmark adapters;
- `results`: per-benchmark JSONL results with resume by sample id, `settings.json` checks;
- `settings` / `presets`: the score-changing settings, their hashes, Qwen's published values;
- `aggregate`, `report`, `compare`, `commands`: summaries, `easyvideor1 report [--compare]`.

Import-light: nothing here imports torch or vLLM.
"""
