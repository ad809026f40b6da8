"""`easyvideor1 eval`: benchmarks x model -> results JSONL (resumable) -> report.

Wires the pieces: adapters (`adapters`), score-changing settings and their hash
(`presets`, `results.check_settings`), frames (`vision.cache.FrameSource`), the model's
prompt stage (`prompts.PromptBuilder`), an engine, and the asynchronous pipeline
(`pipeline.run_async`). A resume skips exactly the ids already written. With `--tools` the
engine is the tool loop (`rollout.tools.multiturn.ToolEngine`) around the HF engine or
training's `VLLMEngine`, fed batch by batch (`HFBatchBackend`): vLLM then does not take
requests one by one as without tools (`AsyncVLLMEngine`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

from easyvideor1.config_tree import ConfigError
from easyvideor1.evaluation.adapters import Benchmark, get_benchmark
from easyvideor1.evaluation.pipeline import (
    AsyncEngineBackend,
    GenerationOutcome,
    HFBatchBackend,
    Item,
    JudgeQueue,
    longest_first,
    run_async,
    run_sync_batches,
    split_longest_first,
)
from easyvideor1.evaluation.html_report import write_run_info
from easyvideor1.evaluation.presets import MEDIA_LIMIT, Overrides, default_max_model_len
from easyvideor1.evaluation.presets import settings as preset_settings
from easyvideor1.evaluation.report import write_report
from easyvideor1.evaluation.results import ResultRow, ResultStore
from easyvideor1.evaluation.settings import EvalSettings, template_digest
from easyvideor1.locks import FolderLock
from easyvideor1.models.families import family_of
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.prompts import Prompt, PromptBuilder
from easyvideor1.rewards import JudgeConfig, RewardConfig, canonical_type, score
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.rollout.vllm_engine import AsyncVLLMEngine, VLLMEngine  # import vllm only when one is built
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.tools.multiturn import ToolEngine, ToolLimits
from easyvideor1.rollout.tools.registry import get_tools
from easyvideor1.rollout.tools.video_tools import ClipSource
from easyvideor1.vision.cache import CacheMismatchError, FrameSource, cache_command
from easyvideor1.vision.config import CACHE_FLAGS, VisionConfig
from easyvideor1.vision.decode import probe_seconds

log = logging.getLogger(__name__)
JUDGED_TYPES = ("open-ended", "caption-mc")  # scored by the LLM judge when one is configured


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
    judge_concurrency: int = 16  # judge requests in flight at once (its own queue, beside generation)
    judge_retries: int = 3  # retries of a failing judge request before its row is recorded as failed
    max_model_len: int | None = None  # vLLM: longest prompt + response (None: from the preset's budget)
    tensor_parallel_size: int = 1  # vLLM: GPUs per engine
    enforce_eager: bool | None = None  # vLLM: no CUDA graphs (None: eager on CPU, graphs on GPU)
    gpu_memory_utilization: float = 0.8  # vLLM: share of GPU memory the engine may take
    chunked_prefill: bool | None = None  # vLLM: split long prefills into chunks (None: vLLM's default)
    shard: tuple[int, int] | None = None  # (i, n): run only shard i of n (`shard_of`); merge with `report`
    data_parallel: int = 1  # engines, one worker process each (`parallel.run_data_parallel`)
    vllm_log: str | None = None  # vLLM's own logs (and its processes' output) go to this file (None: the console)
    sources: dict[str, Any] | None = None  # where the settings came from (`carried.Start.sources`), for settings.json


def sampling_from(settings: EvalSettings) -> SamplingParams:
    s = settings.sampling
    if s.repetition_penalty != 1.0 or s.presence_penalty != 0.0:
        log.warning("repetition/presence penalties are applied by the vLLM engine only")
    return SamplingParams(temperature=s.temperature, top_p=s.top_p if s.temperature else 1.0,
                          top_k=s.top_k if s.temperature else -1, max_tokens=s.max_new_tokens, seed=s.seed)


class Evaluator:
    """Holds the model, processor and engine once; evaluates any number of benchmarks."""

    def __init__(self, model_path: str, engine: str = "hf", preset: str = "qwen2_5_vl_greedy",
                 options: EvalOptions | None = None, sampling=None, vision=None,
                 overrides: Overrides | None = None, tools: tuple[str, ...] = ()):
        """`sampling` / `vision` replace the preset's decoding parameters / frame budget
        (e.g. the demo evaluates with its training budget); `overrides` then change single
        values (the command line's `--max-new-tokens`, `--fps`, ...). `tools`: video tools the
        model may call, multi-turn (`rollout.tools.registry.TOOLS`). With tools, vLLM runs as in
        training (`VLLMEngine` under `ToolEngine`, `max_concurrency` prompts per batch), not as the
        asynchronous `AsyncVLLMEngine`."""
        self.options = options or EvalOptions()
        o = self.options
        self.processor = load_processor(model_path)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
        self.family, self.spec = family_of(config), mrope_spec(config)
        self.score_fn = None  # the benchmarks' own scorers (ROUGE for open-ended answers)
        if o.judge_endpoint:
            if not o.judge_model:
                raise ConfigError("--judge-endpoint needs --judge-model")
            cfg = RewardConfig(judge=JudgeConfig(endpoint=o.judge_endpoint, model=o.judge_model,
                                                 cache_dir=str(Path(o.out_dir) / "judge_cache"),
                                                 concurrency=o.judge_concurrency, max_retries=o.judge_retries))
            self.score_fn = partial(score, cfg=cfg)
        self.settings = eval_settings(model_path, engine, preset, o, config, sampling, vision, overrides)
        try:
            self.tools = get_tools(list(tools))
        except ValueError as e:
            raise ConfigError(str(e).replace("rollout.tools", "--tools")) from None
        self.settings = dataclasses.replace(self.settings, tools=",".join(self.tools))
        try:
            frames = FrameSource(self.settings.vision, o.cache_dir, o.cache_mode)
        except CacheMismatchError as e:  # the flags that read this cache come first
            raise CacheMismatchError(cache_hint(o.cache_dir, e, self.settings.vision)) from None
        # each benchmark renders its own prompt text (`prepare`)
        self.prompts = PromptBuilder(frames, self.processor,
                                     self.family, self.spec, tools=[t.schema() for t in self.tools.values()] or None)
        self.params = sampling_from(self.settings)
        sp = self.settings.sampling
        # prompts per generate call of a synchronous engine (vLLM with tools: as many as it may take)
        self.batch_size = o.max_concurrency if engine == "vllm" and self.tools else o.max_batch
        if engine == "vllm" and not self.tools:
            self.backend = AsyncEngineBackend(AsyncVLLMEngine(model_path, self.processor, dtype=o.dtype,
                                                              repetition_penalty=sp.repetition_penalty,
                                                              presence_penalty=sp.presence_penalty,
                                                              log_file=o.vllm_log,
                                                              **vllm_engine_args(o, self.settings, config)),
                                              o.max_concurrency)
            self.engine = None
        else:
            limits = ToolLimits()  # multi-turn: the tool loop around the engine, default limits
            if engine == "vllm":  # the tool loop on training's synchronous vLLM engine, batch by batch
                self.engine = VLLMEngine(model_path, dtype=o.dtype, enable_sleep_mode=False,
                                         limit_mm_per_prompt=limits.media_limits(MEDIA_LIMIT),
                                         repetition_penalty=sp.repetition_penalty,
                                         presence_penalty=sp.presence_penalty, log_file=o.vllm_log,
                                         **vllm_engine_args(o, self.settings, config))
            else:
                model = load_policy(model_path, dtype=o.dtype)
                model.eval()
                self.engine = HFEngine(model, self.processor, self.family, self.spec, max_batch_size=o.max_batch)
            if self.tools:
                self.engine = ToolEngine(self.engine, self.processor, self.family, self.spec, self.tools,
                                         ClipSource(self.settings.vision), limits)
            self.backend = HFBatchBackend(self.engine, self.batch_size)

    def close(self) -> None:
        """Shut the engine down (vLLM's processes end here, not when the evaluator is collected)."""
        if self.engine is not None:
            self.engine.close()
        else:
            self.backend.close()

    def prepare(self, bench, sample) -> Prompt:
        """`sample`'s prompt with the benchmark's own prompt text (the shared prompt stage)."""
        return self.prompts.build(sample, text=bench.prompt(sample, self.options.template_dir))

    def run(self, benchmarks: list[str], report: bool = True) -> dict[str, Any]:
        """Evaluate `benchmarks` (names or sample files); return {benchmark: Aggregate}.
        `report=False` skips writing report.md/.json/.png/.html (e.g. when timing the run)."""
        o = self.options
        with results_lock(o.out_dir):
            return self._run_locked(benchmarks, report)

    def _run_locked(self, benchmarks: list[str], report: bool) -> dict[str, Any]:
        o = self.options
        benches, stores, items = plan(benchmarks, self.settings, o)
        write_lock = threading.Lock()  # rows come from the event loop and the judge's threads
        progress = _progress(len(items))

        def write(key, row) -> None:
            with write_lock:
                stores[key].append(row)
                progress.update(1)

        try:
            self.execute(benches, items, write)
        finally:
            progress.close()
            for store in stores.values():
                store.close()
        return finish(o.out_dir, benches, report)

    def execute(self, benches: dict[str, Benchmark], items: list[Item],
                write: Callable[[str, ResultRow], None]) -> None:
        """Load, generate and score `items` in their order; `write(benchmark, row)` each row
        as it is ready (from the event loop, or from the judge's threads)."""
        o = self.options
        judged = JudgeQueue(o.judge_concurrency) if self.score_fn is not None else None

        def score_and_write(it: Item, text: str, prompt_tokens: int, output_tokens: int, rollout) -> None:
            row = benches[it.key].result_row(it.sample, text, score_fn=self.score_fn, prompt_tokens=prompt_tokens,
                                             output_tokens=output_tokens, timing=it.timing)
            if rollout.turn_texts:  # a multi-turn response keeps every turn and call
                row = dataclasses.replace(row, turns=list(rollout.turn_texts),
                                          tool_calls=[dataclasses.asdict(c) for c in rollout.tool_calls])
            write(it.key, row)

        def on_outcome(out: GenerationOutcome) -> None:
            it, bench = out.item, benches[out.item.key]
            if out.error is not None or out.rollout is None:
                write(it.key, bench.failed_row(it.sample, out.error or "no output", it.timing))
                it.prompt = None
                return
            args = (it, out.rollout.text, len(it.prompt.inputs.input_ids), len(out.rollout.token_ids), out.rollout)
            it.prompt = None  # free frames and pixel values as soon as the response is in
            if judged is not None and canonical_type(it.sample.problem_type) in JUDGED_TYPES:
                judged.submit(score_and_write, *args)  # the judge waits on the network: not here
            else:
                score_and_write(*args)

        def prepare(it: Item) -> Prompt:
            return self.prepare(benches[it.key], it.sample)

        try:
            if o.asynchronous:
                asyncio.run(run_async(items, prepare, self.backend, self.params, on_outcome,
                                      o.load_workers, o.prefetch))
            else:
                run_sync_batches(items, prepare, self.engine, self.params, on_outcome, self.batch_size)
        finally:
            if judged is not None:
                judged.drain()


def eval_settings(model_path: str, engine: str, preset: str, o: EvalOptions, model_config=None,
                  sampling=None, vision=None, overrides: Overrides | None = None) -> EvalSettings:
    """The score-changing settings of a run (what `settings.json` stores and hashes)."""
    from transformers import AutoConfig

    config = model_config if model_config is not None else AutoConfig.from_pretrained(model_path)
    judge = f"{o.judge_model}@{o.judge_endpoint}" if o.judge_endpoint else ""
    settings = preset_settings(preset, model_path, engine, family=family_of(config).name,
                               prompt_template=o.template_dir or "builtin",
                               prompt_digest=template_digest(o.template_dir), judge=judge,
                               sampling=sampling, overrides=overrides)
    settings = dataclasses.replace(settings, sources={**(o.sources or {}), "dtype": o.dtype})
    return dataclasses.replace(settings, vision=vision) if vision is not None else settings


def cache_hint(cache_dir: str | None, e: CacheMismatchError, wanted: VisionConfig) -> str:
    """A cache mismatch, first with the eval flags that read the cache as it is."""
    fixed = ("grid_factor", "temporal_patch_size", "video_budget_is_total", "family")
    stored = e.stored
    if not stored or any(stored.get(k) != wanted.key_params()[k] for k in fixed):
        return str(e)  # built for another model family: only a new cache helps
    flags = " ".join(f"{flag} {stored[name]:g}" if name == "fps" else f"{flag} {stored[name]}"
                     for name, flag in CACHE_FLAGS.items() if name != "family" and name in stored)
    return (f"{e.detail}. To evaluate at the frames the cache holds, give eval its settings: "
            f"`{flags}`; or leave out --cache-dir to decode at the settings asked for, or build a cache for them: "
            f"`{cache_command(wanted, str(cache_dir).rstrip('/') + '-eval')}`.")


def plan(benchmarks: list[str], settings: EvalSettings, o: EvalOptions
         ) -> tuple[dict[str, Benchmark], dict[str, ResultStore], list[Item]]:
    """The benchmarks, their result stores (settings checked) and the items still to run,
    longest video first; with `o.shard = (i, n)` only shard i's share (`shard_of`)."""
    Path(o.out_dir).mkdir(parents=True, exist_ok=True)
    specs = {get_benchmark(spec).name: spec for spec in benchmarks}
    benches = {name: get_benchmark(spec) for name, spec in specs.items()}
    stores = {name: ResultStore.open(o.out_dir, name, settings) for name in benches}
    everything: list[Item] = []
    for name, bench in benches.items():
        bad: list[ResultRow] = []  # records that do not load: failed rows, counted, never dropped
        everything += [Item(key=name, sample=s) for s in bench.load(o.data_root, bad_records=bad)[: o.max_samples or None]]
        if o.shard is None or o.shard[0] == 0:  # one shard records them, so merged shards do not overlap
            for row in bad:
                if row.id not in stores[name].done_ids():
                    log.warning("%s: %s", name, row.reason)
                    stores[name].append(row)
    totals = {name: sum(it.key == name for it in everything) for name in benches}
    write_run_info(o.out_dir, o.data_root, specs, o.cache_dir, o.cache_mode, o.shard, totals)
    seconds = lru_cache(maxsize=None)(probe_seconds)  # each video probed once
    everything = longest_first(everything, seconds)
    if o.shard is not None:
        index, count = o.shard
        everything = split_longest_first(everything, count, seconds)[index]
    done = {name: store.done_ids() for name, store in stores.items()}
    items = [it for it in everything if it.sample.problem_id not in done[it.key]]
    for name in benches:
        mine = sum(it.key == name for it in everything)
        todo = sum(it.key == name for it in items)
        log.info("%s: %d samples%s, %d already done, %d to run", name, mine,
                 f" in shard {o.shard[0]}/{o.shard[1]}" if o.shard else "", mine - todo, todo)
    return benches, stores, items


def results_lock(out_dir: str) -> FolderLock:
    """One evaluation per results folder: a second one would interleave rows and redo samples."""
    return FolderLock(out_dir, "eval", wait=False, hint=" (it resumes where it stops), or write to another --out folder")


def finish(out_dir: str, benches: dict[str, Benchmark], report: bool = True) -> dict[str, Any]:
    """Aggregate every benchmark's stored rows and write the report."""
    aggregates = {name: bench.aggregate(ResultStore.open(out_dir, name).rows()) for name, bench in benches.items()}
    if report:
        write_report(out_dir, make_source=FrameSource)
    return aggregates


def vllm_engine_args(o: EvalOptions, settings: EvalSettings, model_config) -> dict[str, Any]:
    """The vLLM engine arguments of `o` (`max_model_len` from the preset's budget when unset)."""
    import torch

    args: dict[str, Any] = {
        "max_model_len": o.max_model_len or default_max_model_len(settings, model_config),
        "tensor_parallel_size": o.tensor_parallel_size,
        "gpu_memory_utilization": o.gpu_memory_utilization,
        "enforce_eager": o.enforce_eager if o.enforce_eager is not None else not torch.cuda.is_available(),
    }
    if o.chunked_prefill is not None:
        args["enable_chunked_prefill"] = o.chunked_prefill
    return args


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="eval", unit="sample", dynamic_ncols=True)


def options_from(**kwargs) -> EvalOptions:
    names = {f.name for f in dataclasses.fields(EvalOptions)}
    return EvalOptions(**{k: v for k, v in kwargs.items() if k in names and v is not None})
