"""`easyvideor1 eval`: benchmarks x model -> results JSONL (resumable) -> report.

Wires the pieces: adapters (`adapters`), score-changing settings and their hash
(`presets`, `results.check_settings`), frames (`vision.cache.FrameSource`), the model's
prompt stage (`prompts.PromptBuilder`), an engine, and the asynchronous pipeline
(`pipeline.run_async`). A resume skips exactly the ids already written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from easyvideor1.config_tree import ConfigError
from easyvideor1.evaluation.adapters import get_benchmark
from easyvideor1.evaluation.pipeline import (
    AsyncEngineBackend,
    GenerationOutcome,
    HFBatchBackend,
    Item,
    longest_first,
    run_async,
    run_sync_batches,
)
from easyvideor1.evaluation.presets import settings as preset_settings
from easyvideor1.evaluation.report import write_report
from easyvideor1.evaluation.results import ResultRow, ResultStore
from easyvideor1.evaluation.settings import EvalSettings, template_digest
from easyvideor1.locks import FolderLock
from easyvideor1.models.families import family_of
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.prompts import Prompt, PromptBuilder
from easyvideor1.rewards import JudgeConfig, RewardConfig, score
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.rollout.vllm_engine import AsyncVLLMEngine  # imports vllm only when one is built
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.vision.cache import FrameSource
from easyvideor1.vision.decode import probe_seconds

log = logging.getLogger(__name__)


@dataclass
class EvalOptions:
    """How to run an evaluation (what does not change scores lives here, the rest in EvalSettings)."""

    data_root: str | None = None  # folder the benchmark files and media live under
    out_dir: str = "runs/eval"  # results folder (one JSONL per benchmark, settings.json, report)
    cache_dir: str | None = None  # frame cache (None: decode)
    cache_mode: str = "prefer_cache"  # prefer_cache | cache_only | realtime
    template_dir: str | None = None  # prompt template overrides
    max_samples: int = 0  # per benchmark (0: all)
    load_workers: int = 4  # loading threads
    prefetch: int = 16  # prepared prompts waiting for the engine, at most
    max_batch: int = 8  # HF engine: prompts decoded together
    max_concurrency: int = 64  # vLLM engine: requests in flight
    asynchronous: bool = True  # False: the vanilla load-a-batch-then-generate loop
    dtype: str = "bfloat16"
    judge_endpoint: str | None = None  # OpenAI-compatible URL of an LLM judge for open-ended answers
    judge_model: str | None = None  # the judge's model name


def sampling_from(settings: EvalSettings) -> SamplingParams:
    s = settings.sampling
    if s.repetition_penalty != 1.0 or s.presence_penalty != 0.0:
        log.warning("repetition/presence penalties are applied by the vLLM engine only")
    return SamplingParams(temperature=s.temperature, top_p=s.top_p if s.temperature else 1.0,
                          top_k=s.top_k if s.temperature else -1, max_tokens=s.max_new_tokens, seed=s.seed)


class Evaluator:
    """Holds the model, processor and engine once; evaluates any number of benchmarks."""

    def __init__(self, model_path: str, engine: str = "hf", preset: str = "qwen2_5_vl_greedy",
                 options: EvalOptions | None = None, sampling=None, vision=None):
        """`sampling` / `vision` replace the preset's decoding parameters / frame budget
        (e.g. the demo evaluates with its training budget)."""
        self.options = options or EvalOptions()
        o = self.options
        self.processor = load_processor(model_path)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
        self.family, self.spec = family_of(config), mrope_spec(config)
        self.score_fn = None  # the benchmarks' own scorers (ROUGE for open-ended answers)
        judge = ""
        if o.judge_endpoint:
            if not o.judge_model:
                raise ConfigError("--judge-endpoint needs --judge-model")
            cfg = RewardConfig(judge=JudgeConfig(endpoint=o.judge_endpoint, model=o.judge_model,
                                                 cache_dir=str(Path(o.out_dir) / "judge_cache")))
            self.score_fn = partial(score, cfg=cfg)
            judge = f"{o.judge_model}@{o.judge_endpoint}"
        self.settings = preset_settings(preset, model_path, engine, family=self.family.name,
                                        prompt_template=o.template_dir or "builtin",
                                        prompt_digest=template_digest(o.template_dir), judge=judge,
                                        sampling=sampling)
        if vision is not None:
            self.settings = dataclasses.replace(self.settings, vision=vision)
        # each benchmark renders its own prompt text (`prepare`)
        self.prompts = PromptBuilder(FrameSource(self.settings.vision, o.cache_dir, o.cache_mode), self.processor,
                                     self.family, self.spec)
        self.params = sampling_from(self.settings)
        if engine == "vllm":
            sp = self.settings.sampling
            self.backend = AsyncEngineBackend(AsyncVLLMEngine(model_path, self.processor, dtype=o.dtype,
                                                              repetition_penalty=sp.repetition_penalty,
                                                              presence_penalty=sp.presence_penalty),
                                              o.max_concurrency)
            self.engine = None
        else:
            model = load_policy(model_path, dtype=o.dtype)
            model.eval()
            self.engine = HFEngine(model, self.processor, self.family, self.spec, max_batch_size=o.max_batch)
            self.backend = HFBatchBackend(self.engine, o.max_batch)

    def prepare(self, bench, sample) -> Prompt:
        """`sample`'s prompt with the benchmark's own prompt text (the shared prompt stage)."""
        return self.prompts.build(sample, text=bench.prompt(sample, self.options.template_dir))

    def run(self, benchmarks: list[str]) -> dict[str, Any]:
        """Evaluate `benchmarks` (names or sample files); return {benchmark: Aggregate}."""
        o = self.options
        # One evaluation per results folder: a second one would interleave rows and redo samples.
        with FolderLock(o.out_dir, "eval", wait=False,
                        hint=" (it resumes where it stops), or write to another --out folder"):
            return self._run_locked(benchmarks)

    def _run_locked(self, benchmarks: list[str]) -> dict[str, Any]:
        o = self.options
        benches = {b.name: b for b in (get_benchmark(name) for name in benchmarks)}
        stores = {name: ResultStore.open(o.out_dir, name, self.settings) for name in benches}
        items: list[Item] = []
        for name, bench in benches.items():
            bad: list[ResultRow] = []  # records that do not load: failed rows, counted, never dropped
            samples = bench.load(o.data_root, bad_records=bad)[: o.max_samples or None]
            for row in bad:
                if row.id not in stores[name].done_ids():
                    log.warning("%s: %s", name, row.reason)
                    stores[name].append(row)
            pending = stores[name].pending(samples)
            log.info("%s: %d samples, %d already done, %d to run", name, len(samples),
                     len(samples) - len(pending), len(pending))
            items += [Item(key=name, sample=s) for s in pending]
        items = longest_first(items, probe_seconds)
        progress = _progress(len(items))

        def on_outcome(out: GenerationOutcome) -> None:
            it, bench = out.item, benches[out.item.key]
            if out.error is not None or out.rollout is None:
                row = bench.failed_row(it.sample, out.error or "no output", it.timing)
            else:
                row = bench.result_row(it.sample, out.rollout.text, score_fn=self.score_fn,
                                       prompt_tokens=len(it.prompt.inputs.input_ids),
                                       output_tokens=len(out.rollout.token_ids), timing=it.timing)
            stores[it.key].append(row)
            it.prompt = None  # free frames and pixel values as soon as the row is written
            progress.update(1)

        def prepare(it: Item) -> Prompt:
            return self.prepare(benches[it.key], it.sample)

        try:
            if o.asynchronous:
                asyncio.run(run_async(items, prepare, self.backend, self.params, on_outcome,
                                      o.load_workers, o.prefetch))
            else:
                run_sync_batches(items, prepare, self.engine, self.params, on_outcome, o.max_batch)
        finally:
            progress.close()
            for store in stores.values():
                store.close()
        aggregates = {name: bench.aggregate(ResultStore.open(o.out_dir, name).rows()) for name, bench in benches.items()}
        write_report(o.out_dir)
        return aggregates


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="eval", unit="sample", dynamic_ncols=True)


def options_from(**kwargs) -> EvalOptions:
    names = {f.name for f in dataclasses.fields(EvalOptions)}
    return EvalOptions(**{k: v for k, v in kwargs.items() if k in names and v is not None})
