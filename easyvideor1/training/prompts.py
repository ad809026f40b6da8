"""Stage 1 of a step: samples -> frames -> rendered prompt -> processor outputs, once.

The `Prompt`s built here are handed unchanged to the rollout engine and to every log-prob
pass of the step (upstream decoded up to three times per step). A sample whose media cannot
be read, or whose prompt does not fit, is reported by id with the reason and left out; the
rest of the batch goes on (the trainer pads the rank's groups back to their count).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from easyvideor1.data.templates import render_prompt
from easyvideor1.models.families import Family
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.mrope import MRopeSpec
from easyvideor1.records import Sample
from easyvideor1.rollout.base import Prompt
from easyvideor1.vision.cache import CacheError, FrameSource
from easyvideor1.vision.decode import MediaError

log = logging.getLogger(__name__)


@dataclass
class PromptFailure:
    sample_id: str
    reason: str


def prepare_prompts(samples: list[Sample], frames: FrameSource, processor, family: Family, spec: MRopeSpec,
                    template_dir: str | None = None, max_prompt_tokens: int | None = None,
                    seed_slots: tuple[int, int] | None = None) -> tuple[list[Prompt], list[PromptFailure]]:
    """Frames and model inputs of every sample that can be prepared, and why the others cannot.

    `seed_slots=(first, stride)`: sample i's prompt gets `seed_offset = first + i * stride`, so its
    sampling seeds follow from its place in the global batch, whatever failed before it.
    """
    prompts, failures = [], []
    for i, sample in enumerate(samples):
        try:
            media = frames.frames_for_sample(sample)
            text = render_prompt(sample, template_dir)
            inputs = build_inputs(sample, media, text, processor, family, spec, max_prompt_tokens)
        except (MediaError, CacheError, ValueError) as e:
            failures.append(PromptFailure(sample.problem_id, str(e)))
            log.warning("sample %s skipped this step: %s", sample.problem_id, e)
            continue
        offset = None if seed_slots is None else seed_slots[0] + i * seed_slots[1]
        prompts.append(Prompt(sample=sample, frames=media, inputs=inputs, seed_offset=offset))
    return prompts, failures
