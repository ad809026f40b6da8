"""What a tool is: a Python function with a JSON schema, and what it reads and returns.

    Tool(name, description, parameters, fn)   fn(ctx: ToolContext, args: dict) -> ToolOutput

A tool raises `ToolError` with a short message the model can read when its arguments are out of
range or its budget is spent; the loop (`multiturn.py`) turns it into an error tool turn and
counts it, and never lets it end the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from easyvideor1.models.families import Family
from easyvideor1.records import Frames, Sample


class ToolError(Exception):
    """A bad call: the message goes back to the model as the tool's answer."""


@dataclass
class ToolOutput:
    """A tool's answer: text and media (images: `Frames` without metadata; video clips: with it)."""

    text: str
    """What the model reads (timestamps of the frames included)."""
    media: list[Frames] = field(default_factory=list)
    """Images and clips, shown before the text in the tool turn."""


@dataclass
class ToolContext:
    """What one call may read."""

    sample: Sample
    """The sample whose video the call looks at."""
    frames: list[Frames]
    """The prompt's media (from the frame cache or decoded), reused when they hold what is asked."""
    clips: Any
    """The run's `video_tools.ClipSource` (decodes, and remembers clips for the rest of the group)."""
    family: Family
    """The model family (grid factor and temporal patch size: what a visual token is)."""
    visual_tokens: int
    """Most visual tokens this call may return (per-call budget, or what the response has left)."""


@dataclass(frozen=True)
class Tool:
    """One callable tool: name, description and JSON-schema parameters (`tools=` of the chat
    template), and the function."""

    name: str
    description: str
    parameters: dict
    """JSON schema of the arguments (`type: object`, `properties`, `required`)."""
    fn: Callable[[ToolContext, dict], ToolOutput]

    def schema(self) -> dict:
        """The OpenAI-style function schema the chat template renders."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def visual_tokens(frames: Frames, family: Family) -> int:
    """LLM tokens `frames` take: merged patches per temporal patch (videos: frames padded up to a
    whole temporal patch, as the processors do)."""
    t, _, h, w = frames.pixels.shape
    per_frame = (h // family.grid_factor) * (w // family.grid_factor)
    if frames.metadata is None:
        return per_frame
    tp = family.temporal_patch_size
    return -(-t // tp) * per_frame
