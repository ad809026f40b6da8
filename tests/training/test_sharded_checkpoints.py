"""Sharded checkpoints (`training.state.shards`): each rank writes only its own slices, resumes from only
the slices it holds, and a checkpoint resumes on another number of processes (2 -> 1, 1 -> 2).
`shard_worker.py` saves and loads a plain FSDP2 model under torchrun; the last test trains
the tiny VLM through the real command. Real processes, real files."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.state import checkpoint as ckpt
from easyvideor1.training.state.files import StateFileError, write_state
from test_distributed import TIMEOUT_S, write_config
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

WORKER = str(Path(__file__).resolve().parent / "shard_worker.py")


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _launch(procs: int, *args, fresh_ranks: bool = False) -> None:
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)] if procs > 1 else []
    proc = forkserver.run([sys.executable, *launcher, *args], capture_output=True, text=True, env=_env(),
                          timeout=TIMEOUT_S, fresh_ranks=fresh_ranks)
    assert proc.returncode == 0, proc.stderr[-6000:]


def _same(expected: Path, loaded: Path) -> None:
    a, b = load_file(str(expected)), load_file(str(loaded))
    assert set(a) == set(b) and any(k.startswith("exp_avg/") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key  # resharding copies values: bitwise


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint written by 2 processes and one written by 1, with the values they hold."""
    root = tmp_path_factory.mktemp("shards")
    for procs in (2, 1):
        _launch(procs, WORKER, "save", str(root / f"ckpt{procs}"), str(root / f"saved{procs}"))
    return root


def test_each_rank_writes_and_reads_only_its_own_shard(saved, tmp_path):
    folder = saved / "ckpt2" / "step-000001"
    expected = load_file(str(saved / "saved2" / "expected.safetensors"))
    total = sum(v.numel() for k, v in expected.items() if k.startswith("param/"))
    for part in ("model", "optimizer"):
        held = []
        for rank in (0, 1):
            doc = json.loads((folder / f"{part}.rank{rank:05d}.json").read_text())
            stored = load_file(str(folder / f"{part}.rank{rank:05d}.safetensors"))
            assert set(stored) == set(doc["tensors"])
            held.append(sum(v.numel() for v in stored.values()))
            # no weight matrix is whole in any file: each holds its rank's rows
            assert all(v.shape[0] < doc["tensors"][k]["shape"][0] for k, v in stored.items() if v.dim() == 2
                       and doc["tensors"][k]["shape"][0] > 1)
        share = [h / (total * (2 if part == "optimizer" else 1)) for h in held]
        assert all(0.45 < s < 0.55 for s in share), (part, share)  # ~1/world of the bytes each
    # Resume on 2 ranks from copies in which the other rank's model file is gone: each rank
    # reads only the file with its rows (a full read of the checkpoint would fail here).
    for rank in (0, 1):
        mine = tmp_path / f"for-rank{rank}"
        shutil.copytree(folder, mine)
        (mine / f"model.rank{1 - rank:05d}.safetensors").unlink()
    # fresh ranks: a rank forked from tests/forkserver.py's server starts with its pages resident
    _launch(2, WORKER, "load", str(tmp_path / "for-rank{rank}"), str(tmp_path / "loaded"), fresh_ranks=True)
    _same(saved / "saved2" / "expected.safetensors", tmp_path / "loaded" / "loaded.safetensors")
    full = sum(v.numel() * v.element_size() for v in expected.values())  # weights + AdamW states, whole
    for rank in (0, 1):
        rss = json.loads((tmp_path / "loaded" / f"rss-rank{rank}.json").read_text())
        # this rank's new AdamW states (a third of `full`) and transient grads, slices: reading the
        # whole checkpoint would add `full` by itself
        assert rss["peak"] - rss["before"] < 0.85 * full, (rank, rss, full)


@pytest.mark.parametrize("written,resumed", [(2, 1), (1, 2)])
def test_resume_on_another_number_of_processes_is_exact(saved, tmp_path, written, resumed):
    _launch(resumed, WORKER, "load", str(saved / f"ckpt{written}" / "step-000001"), str(tmp_path))
    _same(saved / f"saved{written}" / "expected.safetensors", tmp_path / "loaded.safetensors")


def test_a_single_file_checkpoint_of_an_older_version_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "step-000003"
    folder.mkdir()
    model = torch.nn.Linear(2, 2)
    save_file(dict(model.state_dict()), folder / "model.safetensors")
    write_state(folder, "optimizer", {"state": {}, "param_groups": []})
    write_state(folder, "state", {"scheduler": None, "rng": [], "trainer": {}, "step": 3})
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(StateFileError) as err:
        ckpt.load_checkpoint(folder, model, opt, None)
    message = str(err.value)
    assert "\n" not in message and str(folder) in message and "single-file" in message
    assert set(ckpt.read_weights(folder)) == {"weight", "bias"}  # `export` still reads its weights


def _train(cfg, procs: int, *overrides: str) -> str:
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)] if procs > 1 else []
    proc = forkserver.run([sys.executable, *launcher, "-m", "easyvideor1.cli", "train", str(cfg), *overrides],
                          capture_output=True, text=True, env=_env(), timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc.stderr


def test_training_resumes_on_another_number_of_processes(tmp_path):
    """Step 2 of a run resumed from a step-1 checkpoint written by 2 processes (resumed by 1) or by
    1 (resumed by 2) ends where the uninterrupted run does. allclose, not equal: the gradients of
    the resumed step are summed over another number of ranks (FSDP2's reduce-scatter against one
    process's sum), which rounds differently, as in test_distributed's 1-vs-2-process check."""
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=1)
    data = write_suite(tmp_path / "synth", num_train=8, num_val=0, seed=4)["train"]
    ckpts = {"checkpoint__every": 1, "checkpoint__resume": "auto"}
    runs = {k: write_config(tmp_path, model, data, tmp_path / k, steps=2, **ckpts) for k in ("one", "two")}
    _train(runs["one"], 1)
    _train(runs["two"], 2)
    w1 = load_file(str(tmp_path / "one" / "hf_model" / "model.safetensors"))
    for written, resumed in (("two", 1), ("one", 2)):
        out = tmp_path / f"{written}_to_{resumed}"
        cfg = write_config(tmp_path, model, data, out, steps=2, checkpoint__every=0,
                           checkpoint__resume=str(tmp_path / written / "checkpoints" / "step-000001"))
        log = _train(cfg, resumed)
        assert "resumed from" in log and "step-000001" in log
        w = load_file(str(out / "hf_model" / "model.safetensors"))
        assert set(w) == set(w1)
        for name in w1:
            assert torch.allclose(w[name], w1[name], rtol=1e-4, atol=1e-5), (written, resumed, name)
