"""Outputs of an asynchronous engine are handed on as each request finishes, not when the next
input arrives: the second sample's load waits until the first sample's row exists (on a
pipeline that only yielded finished requests between inputs, it would wait forever). The
engine is the tiny model's HF engine behind the async `generate_one` interface vLLM's has."""

from __future__ import annotations

import asyncio
import threading

from transformers import AutoConfig

from easyvideor1.data.loading import load_samples
from easyvideor1.data.synth import write_suite
from easyvideor1.data.templates import render_prompt
from easyvideor1.evaluation.pipeline import AsyncEngineBackend, Item, run_async
from easyvideor1.models.families import family_of
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.prompts import PromptBuilder
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.vision.cache import FrameSource
from easyvideor1.vision.config import VisionConfig

WAIT_S = 120.0  # ends the wait on a broken pipeline; a row takes well under a second here


class ThreadedHF:
    """`generate_one` of the tiny HF engine, run on a thread (the shape of AsyncVLLMEngine)."""

    def __init__(self, engine: HFEngine):
        self.engine = engine

    async def generate_one(self, prompt, params):
        return (await asyncio.to_thread(self.engine.generate, [prompt], 1, params))[0][0]


def test_each_output_is_handed_on_when_it_finishes(tmp_path):
    path = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "data", num_train=0, num_val=3, seed=1)["val"]
    samples = load_samples(data)
    processor = load_processor(str(path))
    config = AutoConfig.from_pretrained(path)
    family, spec = family_of(config), mrope_spec(config)
    model = load_policy(str(path), dtype="float32").eval()
    vision = VisionConfig(family="qwen2_5_vl", max_frames=4, video_min_pixels=3136, video_max_pixels=12544,
                          image_min_pixels=3136, image_max_pixels=12544)
    builder = PromptBuilder(FrameSource(vision, None, "realtime"), processor, family, spec)
    written: list[str] = []
    row_written = {s.problem_id: threading.Event() for s in samples}
    waited: dict[str, bool] = {}

    def prepare(it: Item):
        index = [s.problem_id for s in samples].index(it.sample.problem_id)
        if index > 0:  # wait for the previous sample's row before this input is ready
            waited[it.sample.problem_id] = row_written[samples[index - 1].problem_id].wait(WAIT_S)
        return builder.build(it.sample, text=render_prompt(it.sample))

    def on_outcome(out):
        assert out.error is None, out.error
        written.append(out.item.sample.problem_id)
        row_written[out.item.sample.problem_id].set()

    backend = AsyncEngineBackend(ThreadedHF(HFEngine(model, processor, family, spec, max_batch_size=1)), 4)
    asyncio.run(run_async([Item(key=s.problem_id, sample=s) for s in samples], prepare, backend,
                          SamplingParams(temperature=0.0, max_tokens=4), on_outcome, load_workers=3, prefetch=3))
    assert written == [s.problem_id for s in samples]
    assert waited == {s.problem_id: True for s in samples[1:]}
