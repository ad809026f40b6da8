"""Qwen3.5 (linear-attention layers) trains on packed, group-shared rows: `build_run` says both are
on, and two real steps run through them.

Tiny Qwen3.5, float32, the HF engine generating with the very model that trains (its prefill of
left-padded prompts runs packed too), prompts mixing video, image and text, micro-batches of 3
that cut groups, gradient checkpointing (the decoder layers recompute with the packing). That
the numbers equal the padded, unshared path is tests/models/test_linear_attention.py.
"""

import json
import logging

import torch

from easyvideor1.config import load_config
from easyvideor1.models.linear_attention import packed_linear_forward
from easyvideor1.models.packing import PACKED_ATTENTION, PaddedRows, language_attention
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train
from test_distributed import write_config
from test_shared_prefix_training import data  # noqa: F401  (module fixture: mixed video, image and text prompts)

PACKED = "padding-free rows (micro-batch sequences packed in one row, attention per sequence): on"
SHARED = "shared prefix (a group's prompt runs once per micro-batch): on"


def test_qwen3_5_trains_on_packed_shared_rows(tmp_path, data, caplog):  # noqa: F811
    root, _, path = data
    model = build_tiny_model("qwen3_5", tmp_path / "qwen3_5", seed=0)
    out = tmp_path / "out"
    cfg = load_config(str(write_config(
        tmp_path, model, path, out, steps=2, rollout__n=3, training__padding_free=True, training__shared_prefix=True,
        training__rollout_batch_size=2, training__mini_batch_size=2, training__micro_batch_size=3,
        model__gradient_checkpointing=True,
        vision={"family": "qwen3_5", "max_frames": 8, "video_min_pixels": 4096, "video_max_pixels": 16384,
                "image_min_pixels": 4096, "image_max_pixels": 16384})))
    assert cfg.model.dtype == "float32"
    with caplog.at_level(logging.INFO, logger="easyvideor1.training.setup"):
        run = build_run(cfg)
    assert PACKED in caplog.text and SHARED in caplog.text
    assert run.ctx.padding_free and run.ctx.shared_prefix
    assert language_attention(run.model) == PACKED_ATTENTION
    gdn = [m for m in run.model.modules() if type(m).__name__ == "Qwen3_5GatedDeltaNet"]
    assert gdn and all(m.forward.__func__ is packed_linear_forward for m in gdn)
    seen = []  # what the linear-attention layers were handed: packed rows, and left-padded prefills
    hook = gdn[0].register_forward_pre_hook(lambda m, args, kw: seen.append(type(kw.get("packing"))), with_kwargs=True)
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    train(run)
    hook.remove()
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    actor = [v for r in rows for k, v in r.items() if k.startswith("actor/")]
    assert len(rows) == 2 and actor and all(torch.isfinite(torch.tensor(float(v))) for v in actor)
    assert any(t.__name__ == "Packing" for t in seen) and PaddedRows in seen
    moved = [n for n, p in run.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert any("linear_attn" in n for n in moved)
