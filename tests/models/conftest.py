"""Session fixtures: the four tiny model families, built once (frame makers: model_media.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from easyvideor1.models.families import MODEL_FAMILIES, Family, get_family
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import MRopeSpec, mrope_spec
from easyvideor1.models.tiny import build_tiny_model

# The MoE families run their own tests (test_linear_attention, test_routing_replay, test_vllm_moe,
# tests/training/test_moe_families.py), which cover these paths on them; each generic test runs the dense four,
# and a few add a MoE family where its own code runs (`indirect` parametrization of `tiny`: the M-RoPE
# oracles, packed and group-shared gradients with replayed routes).
DENSE_FAMILIES = [name for name, f in MODEL_FAMILIES.items() if not f.moe]


@dataclass
class Tiny:
    """A loaded tiny model of one family."""

    family: Family
    path: Path
    model: object
    processor: object
    spec: MRopeSpec

    @property
    def pad_id(self) -> int:
        return self.processor.tokenizer.pad_token_id


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """Family name -> directory of its tiny model (seed 0)."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {name: build_tiny_model(name, root / name, seed=0) for name in MODEL_FAMILIES}


@pytest.fixture(scope="session", params=DENSE_FAMILIES)
def tiny(request, tiny_dirs) -> Tiny:
    """Each family's tiny model in float32, loaded once per session."""
    path = tiny_dirs[request.param]
    model = load_policy(path, dtype="float32")
    return Tiny(get_family(request.param), path, model, load_processor(path), mrope_spec(model.config))
