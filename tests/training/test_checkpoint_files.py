"""Checkpoints hold no pickle: what a checkpoint folder holds, and that a tampered file (a
crafted pickle that would write a file when unpickled) is refused with a message naming it
and runs no code."""

import os
import pickle

import pytest
import torch

from easyvideor1.errors import UserError
from easyvideor1.training.state import checkpoint as ckpt
from easyvideor1.training.state.files import StateFileError, read_state, write_state


class _Exploit:
    """Unpickling this calls os.system, which creates `target`."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return os.system, (f"touch {self.target}",)


def _train_a_little(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    model(torch.randn(3, 4)).sum().backward()
    opt.step(), sched.step(), opt.zero_grad()
    trainer = {"loader": {"epoch": 1, "index": 3}, "kl_controller": {"coef": 0.25}, "step": 1}
    ckpt.save_checkpoint(tmp_path / "ckpts", 1, model, opt, sched, trainer, keep=2)
    return model, opt, sched


def test_checkpoint_files_are_json_and_safetensors_only(tmp_path):
    model, opt, sched = _train_a_little(tmp_path)
    folder = tmp_path / "ckpts" / "step-000001"
    assert sorted(p.name for p in folder.iterdir()) == [
        "meta.json", "model.rank00000.json", "model.rank00000.safetensors", "optimizer.json",
        "optimizer.rank00000.json", "optimizer.rank00000.safetensors", "optimizer.safetensors", "state.json",
        "state.safetensors"]
    for p in folder.iterdir():
        assert not p.read_bytes().startswith(b"\x80"), f"{p.name} looks like a pickle"
    opt2 = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (s + 1))
    state = ckpt.load_checkpoint(folder, model, opt2, sched2)
    assert state == {"loader": {"epoch": 1, "index": 3}, "kl_controller": {"coef": 0.25}, "step": 1}
    a, b = opt.state_dict(), opt2.state_dict()
    # torch's set_optimizer_state_dict itself turns betas into a list (with a pickle too)
    groups = [[{**g, "betas": tuple(g["betas"])} for g in sd["param_groups"]] for sd in (a, b)]
    assert groups[0] == groups[1]
    for k in a["state"]:
        for name, v in a["state"][k].items():
            assert torch.equal(v, b["state"][k][name]), (k, name)


def test_tree_roundtrip_keeps_types(tmp_path):
    import random

    import numpy as np
    tree = {"py": random.getstate(), "np": np.random.get_state(), 3: [None, True, 1.5, float("inf")],
            "__odd": (torch.arange(3), torch.zeros(())), "t": torch.ones(2, dtype=torch.bfloat16)}
    write_state(tmp_path, "x", tree)
    back = read_state(tmp_path, "x")
    assert back["py"] == tree["py"] and back[3] == tree[3]
    assert back["np"][0] == "MT19937" and np.array_equal(back["np"][1], tree["np"][1])
    assert back["np"][1].dtype == tree["np"][1].dtype
    assert torch.equal(back["__odd"][0], tree["__odd"][0]) and back["t"].dtype == torch.bfloat16
    with pytest.raises(TypeError, match="without pickle"):
        write_state(tmp_path, "y", {"f": object()})


@pytest.mark.parametrize("replaced", ["state.pt", "state.json", "optimizer.json", "optimizer.safetensors",
                                      "state.safetensors", "model.rank00000.safetensors", "model.rank00000.json",
                                      "optimizer.rank00000.safetensors"])
def test_a_crafted_pickle_is_refused_and_runs_nothing(tmp_path, replaced):
    model, opt, sched = _train_a_little(tmp_path)
    folder = tmp_path / "ckpts" / "step-000001"
    target = tmp_path / "pwned"
    if replaced == "state.pt":  # an older version's layout: state.pt instead of the JSON pair
        (folder / "state.json").unlink()
        (folder / "state.safetensors").unlink()
    (folder / replaced).write_bytes(pickle.dumps(_Exploit(target)))
    assert ckpt.list_checkpoints(tmp_path / "ckpts") == [folder]  # found, so it is refused, not skipped
    path = ckpt.resolve_resume(tmp_path / "ckpts", "auto")
    with pytest.raises(StateFileError) as err:
        ckpt.load_checkpoint(path, model, opt, sched)
    assert isinstance(err.value, UserError)
    assert replaced in str(err.value) and "checkpoint.resume=never" in str(err.value)
    assert not target.exists(), "the pickle ran"


def test_each_process_takes_back_its_own_device_generator_on_a_node_with_fewer_gpus():
    """The rule of `device_rng_state`, on CPU generators standing in for CUDA's: a process saves its
    own device's state and takes it back; an older checkpoint saved every device the process saw
    (8 on the old node), and a process on device 3 of a 4-GPU node takes entry 3, never an index
    past the list (torch.cuda.set_rng_state_all raised IndexError there)."""
    states = [torch.Generator().manual_seed(100 + d).get_state() for d in range(8)]
    taken = torch.Generator()
    taken.set_state(ckpt.device_rng_state(states, 3))
    assert torch.equal(torch.randn(4, generator=taken), torch.randn(4, generator=torch.Generator().manual_seed(103)))
    assert torch.equal(ckpt.device_rng_state(states[5:6], 3), states[5])  # this format: one per process
    assert torch.equal(ckpt.device_rng_state(states[:2], 3), states[0])  # a list without device 3
    assert ckpt.device_rng_state([], 0) is None  # saved by a CPU run
    if not torch.cuda.is_available():
        assert ckpt.rng_state()["cuda"] == []
