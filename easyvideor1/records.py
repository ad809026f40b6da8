"""What flows between the stages: samples, frames and their metadata, reward results.

Only plain dataclasses here (no I/O, no torch import at module load), so every stage and
every test can build them by hand.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DATA_TYPES = ("video", "image", "text")


@dataclass
class Sample:
    """One training or evaluation record, in the EasyR1/EasyVideoR1 data schema.

    Media paths are absolute once loaded (resolved against the data root by `data.load_samples`).
    Fields the schema does not name are kept in `extra` for templates and rewards.
    """

    problem: str
    answer: str
    problem_type: str
    data_type: str = "text"  # video | image | text
    videos: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    options: list[str] | None = None
    problem_id: str = ""
    data_source: str = ""
    has_offline_trajectory: bool = False
    offline_output: str | None = None
    video_start: float | None = None  # clip segment start (seconds), sampled not cut
    video_end: float | None = None  # clip segment end (seconds)
    tools: list[str] | None = None  # tools it may call (of `rollout.tools`); None: all of them, []: none
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The record as written to JSONL (extra fields flattened back to the top level)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**self.extra, **d}

    def offered_tools(self, run_tools: Iterable[str]) -> list[str]:
        """The names of `run_tools` (the run's `rollout.tools`, in their order) this sample may call.

        >>> Sample("q", "a", "free-form", tools=["zoom_frame"]).offered_tools(["crop_video", "zoom_frame"])
        ['zoom_frame']
        >>> Sample("q", "a", "free-form").offered_tools(["crop_video"])
        ['crop_video']
        """
        return [t for t in run_tools if self.tools is None or t in self.tools]


@dataclass
class VideoMetadata:
    """What the HF processors and vLLM need to know about sampled frames.

    `fps` is the source video's frame rate and `frames_indices` index the source frames, so
    timestamps are `frames_indices / fps` (Qwen3-VL) and the temporal grid spacing follows
    from them (Qwen2.5-VL `second_per_grid_ts`). Without it the processors silently assume
    24 fps (ENVIRONMENT.md).
    """

    fps: float
    total_num_frames: int
    frames_indices: list[int]
    width: int  # source width
    height: int  # source height
    duration: float  # source duration, seconds
    backend: str = ""

    @property
    def sampled_fps(self) -> float:
        """Effective frame rate of the sampled frames."""
        if len(self.frames_indices) < 2:
            return self.fps
        span = (self.frames_indices[-1] - self.frames_indices[0]) / self.fps
        return (len(self.frames_indices) - 1) / span if span > 0 else self.fps

    def to_hf(self) -> dict[str, Any]:
        """Dict accepted by transformers' video processors and by vLLM (`video_metadata`)."""
        return {
            "fps": float(self.fps),
            "total_num_frames": int(self.total_num_frames),
            "frames_indices": [int(i) for i in self.frames_indices],
            "width": int(self.width),
            "height": int(self.height),
            "duration": float(self.duration),
            "video_backend": self.backend or "torchcodec",
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VideoMetadata:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Frames:
    """Sampled, resized uint8 frames of one video (or one image, T=1) plus their metadata."""

    pixels: torch.Tensor  # [T, 3, H, W] uint8
    metadata: VideoMetadata | None  # None for images
    source: str = ""  # path of the media file
    cache_key: str | None = None  # set when the frames came from (or went to) the cache


@dataclass
class RewardResult:
    """Score of one response. All numbers lie in [0, 1]."""

    overall: float
    accuracy: float
    format: float
    parts: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # set when the scorer raised or timed out (scores are then 0)


@dataclass
class ToolCall:
    """One tool call of a multi-turn response, as the loop ran it."""

    name: str  # the tool named ("" when the call could not be parsed)
    arguments: dict | None
    error: str | None = None  # why the call failed (its tool turn said so); None: it ran
    visual_tokens: int = 0  # LLM tokens of the media it returned


@dataclass
class Rollout:
    """One response to one prompt: generated by the engine, or an offline trajectory."""

    prompt_index: int  # index of the prompt in the step's batch (its group id)
    token_ids: list[int]  # response tokens, end-of-turn token included when generated
    text: str
    logprobs: list[float] | None = None  # behaviour policy's per-token log-probs (None: unknown)
    versions: list[int] | None = None  # per token: the weights' version that sampled it (separate placement)
    routes: Any = None  # MoE: [prompt + response tokens, layers, top_k] int16 experts the engine used (models.routing)
    finish_reason: str = "stop"  # stop | length | offline
    offline: bool = False  # an offline trajectory placed by the hybrid slot
    truncated: bool = False  # cut to the response limit (offline trajectories only)
    # Multi-turn responses (`rollout.tools`): token_ids also hold the tool turns' tokens.
    model_mask: list[bool] | None = None  # per token: sampled by the model (None: every token is)
    media: Any = None  # the tool turns' processor outputs (`rollout.tools.turns.TurnMedia`), or None
    tool_calls: list[ToolCall] = field(default_factory=list)  # every call, in order
    turn_texts: list[str] = field(default_factory=list)  # the model's turns' texts (text: the last one)
