"""Which samples of a step's global batch each data-parallel rank takes: equal counts, balanced tokens.

A rank builds the prompts, generates the responses and runs the passes of the samples it takes,
so its work is the tokens of those samples; with contiguous slices one rank may get all the long
videos and the others wait for it at every collective of the update. Prompts cannot move
afterwards without their pixel tensors, so the samples are assigned *before* they are decoded,
by an estimate of each prompt's tokens from the media's stream headers (no decoding):

    vision tokens = sampled frames / temporal patch x (H / grid) x (W / grid)  per video,
                    (H / grid) x (W / grid)                                     per image,

with the same frame sampling and pixel budget as the prompt will have (`vision.sampling`), plus
the question's text at ~4 bytes per token. The estimates are made once and shared: each process
reads the headers of every world-th sample of the global batch and one all-gather gives every rank
the same list, from which each computes the same assignment (longest first, each to the rank with
the fewest tokens that still has room). Estimated on every rank apart, a header read that fails on
one rank only, or two decoders that count frames differently (torchcodec on one node, PyAV on
another), would give the ranks different partitions: samples trained twice and others never,
silently. A sample whose media cannot be read is estimated from its text alone; the prompt stage
reports it as it does today.

The estimate ignores the responses (unknown before rollout); for video prompts of thousands of
tokens they are the smaller part. Each sample keeps its global slot, so its sampling seeds (and so
its responses) are the same whatever rank takes it.
"""

from __future__ import annotations

import functools
import logging
import os

from easyvideor1 import distributed
from easyvideor1.models.families import get_family
from easyvideor1.records import Sample
from easyvideor1.training.loader import rank_slice
from easyvideor1.vision.config import VisionConfig
from easyvideor1.vision.sampling import frame_indices, image_size, video_size

log = logging.getLogger(__name__)

TEXT_BYTES_PER_TOKEN = 4


@functools.lru_cache(maxsize=65536)
def _video_header(path: str, mtime: float) -> tuple[float, int, int, int]:
    """(fps, frames, height, width) from the stream header (torchcodec's approximate mode, else PyAV)."""
    try:
        from torchcodec.decoders import VideoDecoder

        meta = VideoDecoder(path, seek_mode="approximate").metadata
        return float(meta.average_fps or 0.0), int(meta.num_frames or 0), int(meta.height), int(meta.width)
    except ImportError:
        import av

        with av.open(path) as container:
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0.0)
            frames = stream.frames or int(float(stream.duration * stream.time_base) * rate if stream.duration else 0)
            return rate, int(frames), int(stream.height), int(stream.width)


@functools.lru_cache(maxsize=65536)
def _image_header(path: str, mtime: float) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as image:  # reads the header only
        return image.height, image.width


def estimate_tokens(sample: Sample, cfg: VisionConfig) -> int:
    """Estimated prompt tokens of `sample` under the frame budget `cfg` (module docstring)."""
    family = get_family(cfg.family)
    grid = family.grid_factor
    text = len(sample.problem.encode()) + sum(len(o.encode()) for o in sample.options or [])
    tokens = text // TEXT_BYTES_PER_TOKEN
    for path in sample.videos:
        try:
            fps, frames, height, width = _video_header(path, os.path.getmtime(path))
            n = len(frame_indices(frames, fps, cfg, sample.video_start, sample.video_end))
            h, w = video_size(height, width, n, cfg)
            tokens += n // family.temporal_patch_size * (h // grid) * (w // grid)
        except Exception:  # unreadable: the prompt stage names it; the estimate counts its text only
            continue
    for path in sample.images:
        try:
            h, w = image_size(*_image_header(path, os.path.getmtime(path)), cfg)
            tokens += (h // grid) * (w // grid)
        except Exception:
            continue
    return max(tokens, 1)


def balanced_slots(costs: list[int], world: int) -> list[list[int]]:
    """Global slots (indices of `costs`) per rank: `len(costs) / world` each, longest first to the
    rank with the fewest tokens that has room (ties: the lower rank); each rank's slots ascending."""
    if len(costs) % world:
        raise ValueError(f"{len(costs)} samples cannot be split evenly over {world} ranks; make the "
                         "batch size a multiple of the number of data-parallel ranks")
    per = len(costs) // world
    totals, slots = [0] * world, [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min((r for r in range(world) if len(slots[r]) < per), key=lambda r: (totals[r], r))
        slots[rank].append(i)
        totals[rank] += costs[i]
    return [sorted(s) for s in slots]


def shared_estimates(samples: list[Sample], cfg: VisionConfig) -> list[int]:
    """`estimate_tokens` of every sample, the same list on every process: each reads every
    world-th sample's headers, one all-gather joins them (a collective: every process calls it)."""
    here, everywhere = distributed.rank(), distributed.world_size()
    mine = {i: estimate_tokens(samples[i], cfg) for i in range(here, len(samples), everywhere)}
    costs = [0] * len(samples)
    for part in distributed.all_gather_objects(mine):
        for i, cost in part.items():
            costs[i] = cost
    return costs


def rank_slots(samples: list[Sample], rank: int, world: int, cfg: VisionConfig | None) -> list[int]:
    """The global slots data-parallel rank `rank` of `world` takes: balanced by estimated tokens
    when `cfg` is given (`training.balance_ranks`; `shared_estimates`, a collective of every
    process when `world` > 1), else its contiguous share."""
    if world == 1 or cfg is None:
        return rank_slice(list(range(len(samples))), rank, world)
    return balanced_slots(shared_estimates(samples, cfg), world)[rank]
