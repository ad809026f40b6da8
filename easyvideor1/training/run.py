"""`Run`: what one training run holds between steps, built once by `training.setup.build_run`.

The loop (`training.trainer`) and validation (`training.validation`) read it; each stage
takes the pieces it needs: the prompt stage (`prompts.PromptBuilder`), the rollout stage
(`training.groups.RolloutStage`: engine, scorer, sampling), the models and the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from easyvideor1.algorithms.kl import KLController
from easyvideor1.config import Config
from easyvideor1.prompts import Prompt, PromptBuilder
from easyvideor1.records import Sample
from easyvideor1.training.asynchronous.trainer_side import RemoteRollouts
from easyvideor1.training.groups import RolloutStage
from easyvideor1.training.loader import PromptLoader
from easyvideor1.training.metrics import MetricsSink
from easyvideor1.training.sequence_parallel import DataParallel
from easyvideor1.training.sequences import ForwardContext
from easyvideor1.training.skips import SkipLedger


@dataclass
class Run:
    """Everything one training run uses; a test can build one with a tiny model or another engine."""

    cfg: Config
    model: torch.nn.Module  # the policy (FSDP2-sharded when a process group exists)
    reference: torch.nn.Module | None  # frozen reference (None when KL is off)
    optimizer: torch.optim.Optimizer
    scheduler: Any
    kl: KLController  # the KL coefficient (adaptive: state that lives across steps)
    loader: PromptLoader
    prompts: PromptBuilder  # sample -> Prompt (frames, template, processor), for every stage
    rollouts: RolloutStage  # prompts -> scored groups (engine, scorer, sampling)
    ctx: ForwardContext  # what the log-prob passes need
    padding: Prompt  # fully masked stand-in for samples that failed (`PromptBuilder.empty`)
    val_samples: list[Sample] = field(default_factory=list)
    sink: MetricsSink | None = None
    rank: int = 0
    world: int = 1
    data: DataParallel | None = None  # data-parallel place under sequence parallelism (None: rank, world)
    rollout_correction: str = "none"  # algorithm.rollout_correction with `auto` resolved (training.setup)
    remote: RemoteRollouts | None = None  # rollout.placement=separate: the rollout side's handle (process or rank)
    step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    skips: SkipLedger = field(default_factory=SkipLedger)  # samples skipped at run time, against data.max_skip_fraction

    @property
    def data_parallel(self) -> DataParallel:
        """Rank and world of the prompts this rank holds (`training.sequence_parallel`)."""
        return self.data if self.data is not None else DataParallel(self.rank, self.world)
