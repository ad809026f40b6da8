"""Ulysses sequence parallelism (`models.ulysses`): the row split and padding, the vision tower
split into shares, the all-to-all and the collectives with gradients (2 gloo processes), and
log-probs and 3 SGD steps under SP equal to one process without it (real torchrun, tiny models,
a packed video + text + image + video/image row; the text prompt's response calls a tool, so a
clip comes back mid-sequence and the tool turn sits inside the response, outside the loss).
Qwen3.5 runs at the "medium" size: its linear-attention layers split by key heads, and the tiny
size has one. Qwen3-VL-MoE runs in Qwen3-VL's launches (`RIDERS`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from model_media import make_image, make_sample, make_video

from easyvideor1.models.families import get_family
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.packing import Packing
from easyvideor1.models.ulysses import (SequenceParallel, kv_repeats, local_span, pad_packing, padded_length,
                                        vision_shares)
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

HERE = Path(__file__).parent
TIMEOUT_S = 1800  # ends a hang; these runs take seconds to a minute on 2 busy cores
SP_FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"]
# A family that rides another's launches (the same processes, no torchrun of its own): Qwen3-VL-MoE
# with its dense twin, as the trainer runs it under SP (routing_replay=none: HF's own routers, no
# routes; replay is refused, tests/models/test_routing_replay.py).
RIDERS = {"qwen3_vl": ["qwen3_vl_moe"]}


@pytest.fixture(scope="module")
def medium_dirs(tmp_path_factory):
    """Family -> its "medium" tiny model (4 heads, 2 key/value heads; Qwen3.5: 2 linear key heads, 4 value heads)."""
    from easyvideor1.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("medium_models")
    return {name: build_tiny_model(name, root / name, seed=0, size="medium") for name in ("qwen2_5_vl", "qwen3_5")}


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}


def _run(args, procs: int = 1):
    launcher = [sys.executable] if procs == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    "--nproc-per-node", str(procs)]
    p = forkserver.run(launcher + [str(a) for a in args], capture_output=True, text=True, env=_env(),
                       timeout=TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-6000:]
    return p


def test_row_padding_and_spans():
    assert [padded_length(n, 4) for n in (1, 4, 5, 8)] == [4, 4, 8, 8]
    sp = [SequenceParallel(None, r, 3) for r in range(3)]
    assert [local_span(12, s) for s in sp] == [(0, 4), (4, 8), (8, 12)]
    plain = pad_packing(Packing((0, 5, 7)), 9)
    assert plain.bounds == (0, 5, 7, 9) and plain.segment is None and plain.shared == ()
    shared = pad_packing(Packing((0, 4, 6), torch.tensor([0, 0, 1, 2, 0, 1]), (True, True)), 8)
    assert shared.bounds == (0, 4, 6, 8) and shared.shared == (True, True, False)
    assert shared.segment.tolist() == [0, 0, 1, 2, 0, 1, 0, 0]
    assert pad_packing(Packing((0, 8)), 8).bounds == (0, 8)  # already a multiple: no pad block


def test_kv_head_repeats():
    # repeated heads keep the grouping: k divides kv * rep, and kv * rep divides the query heads (lcm)
    assert kv_repeats(4, 2) == 1 and kv_repeats(1, 2) == 2 and kv_repeats(2, 4) == 2 and kv_repeats(2, 3) == 3


def test_vision_shares_cover_every_unit_once_in_order():
    images = torch.tensor([[1, 2, 4], [1, 4, 4]])
    videos = torch.tensor([[3, 4, 4], [2, 2, 2]])
    for k in (1, 2, 3, 5, 12):
        shares = vision_shares(images, videos, k)
        assert len(shares) == k
        units = [(r.kind, r.item, t) for share in shares for r in share for t in range(r.t0, r.t1)]
        expected = [("image", 0, 0), ("image", 1, 0)] + [("video", 0, t) for t in range(3)] + \
                   [("video", 1, t) for t in range(2)]
        assert units == expected, k  # every temporal patch once, in order: contiguous shares
        patches = [sum((r.t1 - r.t0) * r.grid[1] * r.grid[2] for r in share) for share in shares]
        assert max(patches) - min(patches) <= 16 or k > 7, (k, patches)  # balanced up to one unit (k <= units)
    runs = vision_shares(images, videos, 2)
    rows = [r.patch_rows for share in runs for r in share if r.kind == "video"]
    assert rows[0].start == 0 and rows[-1].stop == 3 * 16 + 2 * 4  # pixel rows of the videos, in order


@pytest.mark.parametrize("name", SP_FAMILIES)
def test_tower_on_shares_equals_whole(tiny_dirs, name):
    """Cutting a video along t and spreading images and temporal patches over ranks gives the
    features of the whole call (the towers attend within a temporal patch)."""
    family = get_family(name)
    model = load_policy(tiny_dirs[name], dtype="float32")
    processor = load_processor(tiny_dirs[name])
    spec = mrope_spec(model.config)
    frames = [make_video(family, frames=6, rows=2, cols=2), make_image(family), make_video(family, frames=4, seed=5)]
    inputs = build_inputs(make_sample("mix", frames), frames, "What?", processor, family, spec)
    visual = model.model.visual
    pixels = {"image": inputs.pixel_values, "video": inputs.pixel_values_videos}
    with torch.no_grad():
        whole = [visual(inputs.pixel_values, grid_thw=inputs.image_grid_thw),
                 visual(inputs.pixel_values_videos, grid_thw=inputs.video_grid_thw)]
        whole_levels = [torch.cat([w.pooler_output for w in whole])]
        if getattr(whole[0], "deepstack_features", None):
            whole_levels += [torch.cat(parts) for parts in zip(*(w.deepstack_features for w in whole))]
        assert inputs.video_grid_thw[:, 0].tolist() == [3, 2]  # cuts inside a video happen
        for k in (2, 3):
            parts = []
            for share in vision_shares(inputs.image_grid_thw, inputs.video_grid_thw, k):
                px = torch.cat([pixels[r.kind][r.patch_rows] for r in share])
                grid = torch.tensor([[r.t1 - r.t0, r.grid[1], r.grid[2]] for r in share])
                out = visual(px, grid_thw=grid)
                parts.append([out.pooler_output] + list(getattr(out, "deepstack_features", None) or []))
            for level, expected in enumerate(whole_levels):
                got = torch.cat([p[level] for p in parts])
                # other batch shapes in the tower's matmuls: float32 rounding only
                torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_collectives_round_trip():
    _run([HERE / "ulysses_collectives_worker.py"], procs=2)


def _compare(model_dir, one, many, vision_moves: bool = True, name: str = ""):
    a, b = torch.load(one, weights_only=False), torch.load(many, weights_only=False)
    assert a["attention"]["problems"] == b["attention"]["problems"] == []  # a fused CUDA kernel takes every call
    fa, fb = a["first"], b["first"]
    mask = fa["mask"]
    assert torch.equal(mask, fb["mask"]) and int(mask.sum()) >= 8
    # other matmul shapes on each rank: float32 rounding only (measured <= 5e-7); a token scored from
    # the wrong position, a lost pad block or another rank's heads moves them by > 0.1
    torch.testing.assert_close(fb["logprobs"][mask], fa["logprobs"][mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(fb["entropy"][mask], fa["entropy"][mask], rtol=0, atol=1e-5)
    initial = load_policy(model_dir, dtype="float32").state_dict()
    pa, pb = a["params"], b["params"]
    assert set(pa) == set(pb)
    moved = {}
    for key in pa:
        # 3 SGD steps at lr 1: a gradient off by the SP size (a factor) moves them by ~|step| >> atol
        torch.testing.assert_close(pb[key], pa[key], rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} {key}: {m}")
        moved[key] = (pa[key] - initial[key]).abs().max().item() > 1e-3
    text = [k for k in moved if "visual" not in k]
    assert sum(moved[k] for k in text) > len(text) // 2  # most tensors moved, far beyond the tolerance
    # the tower learns from real vision tokens; from masked dummies alone its gradient is exactly 0
    assert any(moved[k] for k in moved if "visual" in k) == vision_moves
    return moved


@pytest.fixture(scope="module")
def sp2_runs(tiny_dirs, medium_dirs, tmp_path_factory):
    """Every family of `SP_FAMILIES` (and their `RIDERS`) in one process without SP and in one
    torchrun of 2 with SP 2: family -> (model, one-process result, SP result). One launch pair for
    all of them (was a pair per family: each launch pays a torchrun, its ranks, gloo and FSDP2 set-up;
    the worker runs the families one after another in the same processes)."""
    families = [f for name in SP_FAMILIES for f in (name, *RIDERS.get(name, []))]
    models = [medium_dirs[f] if f == "qwen3_5" else tiny_dirs[f] for f in families]
    out = tmp_path_factory.mktemp("sp2_runs")
    one, sp2 = ([out / f"{f}-{kind}.pt" for f in families] for kind in ("one", "sp2"))
    worker = HERE / "ulysses_worker.py"
    joined = lambda items: ",".join(map(str, items))
    _run([worker, joined(families), joined(models), joined(one), 1])
    _run([worker, joined(families), joined(models), joined(sp2), 2], procs=2)
    return {f: (m, a, b) for f, m, a, b in zip(families, models, one, sp2)}


@pytest.mark.parametrize("name", SP_FAMILIES)
def test_sp2_equals_one_process(sp2_runs, name):
    """2 gloo processes with sequence_parallel_size 2 (FSDP2 over both) == 1 process, no SP:
    log-probs and entropies, and the parameters after 3 SGD steps (Qwen3.5: each rank runs the
    linear-attention layers' conv and recurrence for 1 of 2 key heads and 2 of 4 value heads).
    Qwen3-VL-MoE rides with Qwen3-VL: each rank routes its share of the row, and the grouped
    experts (sharded on dim 0 by FSDP2) and the routers train as in one process."""
    for family in (name, *RIDERS.get(name, [])):
        model, a, b = sp2_runs[family]
        moved = _compare(model, a, b, name=family)
        assert torch.load(a, weights_only=False)["first"]["length"] % 2 == 1  # a pad block was added
        if get_family(family).moe:  # every layer's experts and router, beyond the tolerance
            for part in (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj", ".mlp.gate.weight"):
                assert all(moved[k] for k in moved if part in k) and any(part in k for k in moved), part


def test_sp4_empty_vision_shares_and_repeated_kv_heads(tmp_path):
    """4 ranks on a text-only row (2 dummy vision units: 2 ranks encode an empty share) of a model
    with 4 heads and 2 key/value heads (repeated to 4) == 1 process."""
    from easyvideor1.models.tiny import build_tiny_model

    model = build_tiny_model("qwen2_5_vl", tmp_path / "medium", seed=0, size="medium")
    worker = HERE / "ulysses_worker.py"
    _run([worker, "qwen2_5_vl", model, tmp_path / "one.pt", 1, 1, "text"])
    _run([worker, "qwen2_5_vl", model, tmp_path / "sp4.pt", 4, 1, "text"], procs=4)
    _compare(model, tmp_path / "one.pt", tmp_path / "sp4.pt", vision_moves=False)


def test_dp2_sp2_equals_dp2(medium_dirs, tmp_path):
    """4 processes, data-parallel 2 x sequence-parallel 2, == 2 data-parallel processes. The model
    has 4 heads and 2 key/value heads, so each rank attends with 2 query heads over 1 key/value
    head after the all-to-all (GQA, as Qwen2.5-VL-7B at SP 4: 7 / 1), which `_compare` checks no
    call gives a fused CUDA kernel a reason to refuse. (Qwen3.5's dp2 x sp2 runs through the
    trainer: tests/training/test_sequence_parallel.py; here it passed too, in 31 s.)"""
    model = medium_dirs["qwen2_5_vl"]
    worker = HERE / "ulysses_worker.py"
    _run([worker, "qwen2_5_vl", model, tmp_path / "dp2.pt", 1, 2], procs=2)
    _run([worker, "qwen2_5_vl", model, tmp_path / "dp2sp2.pt", 2, 2], procs=4)
    _compare(model, tmp_path / "dp2.pt", tmp_path / "dp2sp2.pt")
    assert torch.load(tmp_path / "dp2sp2.pt", weights_only=False)["attention"]["gqa_calls"] > 0


def test_models_that_cannot_split_say_why(tiny_dirs):
    from transformers import AutoConfig

    from easyvideor1.training.sequence_parallel import sequence_parallel_blocker

    qwen25 = AutoConfig.from_pretrained(tiny_dirs["qwen2_5_vl"])
    qwen25._attn_implementation = "sdpa"  # as load_policy loads it
    assert sequence_parallel_blocker(qwen25, 2) is None  # 2 heads, 1 kv head (repeated)
    assert "2 attention heads do not divide by sequence_parallel_size=4" in sequence_parallel_blocker(qwen25, 4)
    qwen35 = AutoConfig.from_pretrained(tiny_dirs["qwen3_5"])
    qwen35._attn_implementation = "sdpa"
    # 2 attention heads split; its linear-attention layers' 1 key head cannot (never repeated)
    assert sequence_parallel_blocker(qwen35, 2) == (
        "its 1 linear-attention key heads and 2 value heads must both divide by sequence_parallel_size=2; "
        "choose a k that divides 1")
    qwen35.text_config.linear_num_key_heads = 2  # as the "medium" size
    qwen35.text_config.linear_num_value_heads = 6
    assert sequence_parallel_blocker(qwen35, 2) is None
    qwen35.text_config.num_attention_heads = 6
    assert "2 linear-attention key heads and 6 value heads must both divide by sequence_parallel_size=3; " \
           "choose a k that divides 2" in sequence_parallel_blocker(qwen35, 3)
