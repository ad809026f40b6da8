"""The prompt stage: sample -> frames -> template text -> processor outputs, in one place.

    PromptBuilder(frames, processor, family, spec, render, max_prompt_tokens).build(sample) -> Prompt

Training, validation and evaluation all build their prompts with a `PromptBuilder` made once
per run, and hand the same `Prompt` objects to the rollout engine and to every log-prob pass
of the step, so engine and trainer see identical token ids, grids and M-RoPE positions (and
frames are decoded once, not once per stage as upstream). A sample whose media cannot be
read, or whose prompt does not fit, is a `PromptFailure` naming it and the reason; the rest of
the batch goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from easyvideor1.models.families import Family
from easyvideor1.models.inputs import ModelInputs, build_inputs
from easyvideor1.models.mrope import MRopeSpec
from easyvideor1.records import Frames, Sample
from easyvideor1.vision.cache import CacheError, FrameSource
from easyvideor1.vision.decode import MediaError

log = logging.getLogger(__name__)


@dataclass
class Prompt:
    """One prepared prompt, shared by the engine and the trainer."""

    sample: Sample
    """The sample the prompt was rendered from."""
    frames: list[Frames]
    """Its videos and images as given to the processor (uint8, already sampled and resized)."""
    inputs: ModelInputs
    """Processor outputs and M-RoPE ids of the prompt alone (`inputs.prompt_len == len(input_ids)`)."""
    seed_offset: int | None = None
    """First sampling seed of this prompt's responses, relative to `SamplingParams.seed` (None:
    right after the previous prompt's). The trainer numbers it by the sample's place in the global
    batch, so seeds depend neither on the number of ranks nor on which samples failed to load."""
    padding: bool = False
    """A stand-in that keeps every rank's group count equal (`PromptBuilder.empty`): never trained on."""
    placeholder_ids: list[int] | None = None
    """A continuation of the tool loop: its token ids with each image and video one placeholder
    token (as its text tokenises), for engines that expand placeholders themselves (vLLM), and
    `frames` then holds the prompt's and the tool turns' media in sequence order. None: the
    engine tokenises `inputs.prompt_text`."""

    @property
    def modality(self) -> str:
        """ "video", "image", "image+video" or "text": what vision input the prompt carries."""
        has_video = self.inputs.pixel_values_videos is not None
        has_image = self.inputs.pixel_values is not None
        return {(True, True): "image+video", (True, False): "video", (False, True): "image"}.get(
            (has_video, has_image), "text"
        )


@dataclass
class PromptFailure:
    """A sample that could not be prepared, and why (the message says what to do)."""

    sample_id: str
    reason: str


def empty_prompt(processor, family: Family, spec: MRopeSpec, sample_id: str = "<padding>") -> Prompt:
    """A text prompt with an empty user turn, cheap to run: what a rank with nothing left to do
    decodes or trains on (fully masked) to keep the collectives of the others going."""
    sample = Sample(problem="", answer="", problem_type="padding", problem_id=sample_id)
    return Prompt(sample=sample, frames=[], inputs=build_inputs(sample, [], "", processor, family, spec), padding=True)


@dataclass
class PromptBuilder:
    """Builds `Prompt`s for one model and one frame budget; made once, used for every sample."""

    frames: FrameSource
    """Where frames come from: the cache, or decoding (and the vision budget)."""
    processor: Any
    """The model's processor (tokenizer + image and video processors)."""
    family: Family
    """The model family (frame-size multiple, processor quirks)."""
    spec: MRopeSpec
    """The model's M-RoPE layout, for the position ids."""
    render: Callable[[Sample], str] | None = None
    """Sample -> user prompt text (the task's Jinja template); None: every `build` gives the text
    (evaluation: each benchmark's own prompt)."""
    max_prompt_tokens: int | None = None
    """Longer prompts are failures (None: no limit)."""
    tools: list[dict] | None = None
    """Function schemas of the run's tools (`rollout.tools`, None: no tools); the chat template of
    each prompt lists those its sample is offered (`Sample.offered_tools`), or none."""
    data_root_setting: str = "data.data_root"
    """What sets the data root where `build_many`'s messages say so (training's config field; the
    commands' flag is `--data-root`)."""
    reported: set[str] = field(default_factory=set, repr=False)
    """Ids of the samples `build_many` has reported: each is logged once per builder (per run)."""

    def build(self, sample: Sample, text: str | None = None, seed_offset: int | None = None) -> Prompt:
        """The prompt of `sample` (`text` replaces the rendered one); raises `MediaError`,
        `CacheError` or `ValueError` naming the sample when it cannot be built."""
        if text is None and self.render is None:
            raise ValueError(f"sample {sample.problem_id!r}: no prompt text (this PromptBuilder has no renderer)")
        media = self.frames.frames_for_sample(sample)
        text = self.render(sample) if text is None else text
        offered = sample.offered_tools(t["function"]["name"] for t in self.tools or [])
        schemas = [t for t in self.tools or [] if t["function"]["name"] in offered] or None
        inputs = build_inputs(sample, media, text, self.processor, self.family, self.spec, self.max_prompt_tokens,
                              schemas)
        return Prompt(sample=sample, frames=media, inputs=inputs, seed_offset=seed_offset)

    def build_many(self, samples: list[Sample], seed_offsets: list[int] | None = None
                   ) -> tuple[list[Prompt], list[PromptFailure]]:
        """Every sample that can be prepared, and why the others cannot (each logged by id, once:
        later failures of the same sample are returned, and counted by the trainer, silently).

        `seed_offsets[i]`: sample i's prompt's `seed_offset`; the trainer derives it from the sample's
        slot in the global batch, so its sampling seeds do not depend on which rank takes it or on
        what failed before it.
        """
        prompts, failures = [], []
        for i, sample in enumerate(samples):
            offset = None if seed_offsets is None else seed_offsets[i]
            try:
                prompts.append(self.build(sample, seed_offset=offset))
            except (MediaError, CacheError, ValueError) as e:
                reason = str(e).replace("--data-root", self.data_root_setting)
                failures.append(PromptFailure(sample.problem_id, reason))
                if sample.problem_id not in self.reported:
                    self.reported.add(sample.problem_id)
                    log.warning("sample %s skipped: %s (said once; later steps skip it too, counted in "
                                "data/prompt_failures)", sample.problem_id, reason)
        return prompts, failures

    def empty(self, sample_id: str = "<padding>") -> Prompt:
        """`empty_prompt` for this model."""
        return empty_prompt(self.processor, self.family, self.spec, sample_id)
