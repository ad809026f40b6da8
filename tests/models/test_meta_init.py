"""Meta-device start-up (`models.meta_init`) gives bitwise the model the previous start-up gave
(`from_pretrained` on CPU, then LoRA, then FSDP2): every parameter and buffer (rotary `inv_freq`
recomputed after `to_empty`), dtypes, `requires_grad`, tied embeddings, config, generation config and
the RNG state after start-up (LoRA's draws) -- in one process for every family, and on each rank's
shard under torchrun with 2 processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from easyvideor1.errors import UserError
from easyvideor1.models.families import MODEL_FAMILIES
from easyvideor1.models.loading import load_policy, load_reference
from easyvideor1.models.lora import apply_lora
from easyvideor1.models.meta_init import WeightSource, fill_weights
from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

WORKER = Path(__file__).with_name("meta_init_worker.py")


def _build(path, kind, device, lora):
    torch.manual_seed(0)
    if kind == "policy":
        model = load_policy(path, "float32", "sdpa", True, True, device)
    else:
        model = load_reference(path, "bfloat16", "sdpa", device)
    source = WeightSource(path, model) if device == "meta" else None
    if lora:
        apply_lora(model, 4, 8.0, 0.0, [], True, ["lm_head"], base_dtype=torch.bfloat16)
    if source is not None:
        fill_weights(model, source, "cpu")
    return model, torch.get_rng_state()


def _assert_same(old, new):
    a, b = dict(old.named_parameters(remove_duplicate=False)), dict(new.named_parameters(remove_duplicate=False))
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].requires_grad == b[name].requires_grad, name
        assert torch.equal(a[name], b[name]), name
    a, b = dict(old.named_buffers()), dict(new.named_buffers())
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) and a[n].dtype == b[n].dtype for n in a)
    tied = [m.lm_head.weight is m.get_input_embeddings().weight for m in (old, new)]
    assert tied[0] == tied[1]
    assert old.config.to_dict() == new.config.to_dict()
    assert old.generation_config.to_dict() == new.generation_config.to_dict()
    assert old.training == new.training


@pytest.mark.parametrize("family", list(MODEL_FAMILIES))
def test_one_process_equals_from_pretrained(tiny_dirs, family):
    for kind in ("policy", "reference"):
        old, _ = _build(tiny_dirs[family], kind, "cpu", lora=False)
        new, _ = _build(tiny_dirs[family], kind, "meta", lora=False)
        _assert_same(old, new)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_tied_and_lora_one_process(tmp_path, family):
    path = build_tiny_model(family, tmp_path / "tied", tie_embeddings=True)
    old, _ = _build(path, "policy", "cpu", lora=False)
    new, _ = _build(path, "policy", "meta", lora=False)
    assert new.lm_head.weight is new.get_input_embeddings().weight
    _assert_same(old, new)
    (old, old_rng), (new, new_rng) = (_build(path, "policy", d, lora=True) for d in ("cpu", "meta"))
    _assert_same(old, new)  # the adapters too: peft drew them from the same RNG state
    assert torch.equal(old_rng, new_rng)


def test_a_checkpoint_missing_weights_is_refused(tmp_path, tiny_dirs):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "cut"
    folder.mkdir()
    for f in Path(tiny_dirs["qwen2_5_vl"]).iterdir():
        if f.name != "model.safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    weights = load_file(str(Path(tiny_dirs["qwen2_5_vl"]) / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if "layers.1." not in k}, str(folder / "model.safetensors"))
    model = load_policy(folder, "float32", "sdpa", device="meta")
    with pytest.raises(UserError, match="has no weight for .* tensors"):  # one line from the CLI
        WeightSource(folder, model)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")  # not read slice by slice
    with pytest.raises(UserError, match="no model.safetensors or model.safetensors.index.json"):
        WeightSource(folder, model)


def test_two_processes_each_rank_shard_equal(tmp_path):
    path = build_tiny_model("qwen2_5_vl", tmp_path / "tied", tie_embeddings=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "result"
    p = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(WORKER), str(path), str(out), "policy,lora,reference"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    for rank in (0, 1):
        result = json.loads(Path(f"{out}.{rank}").read_text())
        for case, r in result.items():
            assert r["differ"] == [] and r["rng"] and r["config"], (rank, case, r)
            assert r["tied"] == [False, False]  # FSDP2 unties the head in both
