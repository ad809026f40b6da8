"""`write_hf` streams: under torchrun (2 processes, FSDP2) each whole tensor is gathered one at a
time and rank 0 writes safetensors files of bounded size (several here, with the index). The
folder loads with transformers and equals, weight for weight and in its outputs, the folder the
previous writer made (the whole merged state dict in memory, `save_pretrained` of a skeleton)."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from easyvideor1.models.lora import merged_state_items
from easyvideor1.models.tiny import build_tiny_model
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

sys.path.insert(0, str(Path(__file__).parent))
from export_worker import policy  # noqa: E402

WORKER = Path(__file__).with_name("export_worker.py")


def previous_export(path, case, out):
    """The writer before streaming: every merged tensor in one dict, then save_pretrained."""
    from transformers import AutoModelForImageTextToText

    model = policy(path, case)
    state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in merged_state_items(model)}
    with torch.device("meta"):
        skeleton = AutoModelForImageTextToText.from_config(copy.deepcopy(model.config), attn_implementation="sdpa")
    skeleton.generation_config = model.generation_config
    skeleton.save_pretrained(out, state_dict=state)


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """Both cases written by one torchrun of 2 processes."""
    root = tmp_path_factory.mktemp("stream")
    path = build_tiny_model("qwen2_5_vl", root / "model", tie_embeddings=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    p = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(WORKER), str(path), str(root / "streamed"), "lora,full", str(40_000)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return path, root / "streamed"


@pytest.mark.parametrize("case", ["lora", "full"])
def test_two_process_stream_equals_previous_export(tmp_path, streamed, case):
    from transformers import AutoModelForImageTextToText

    path, out = streamed[0], streamed[1] / case
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted({f for f in index["weight_map"].values()})
    assert len(files) > 3 and all((out / f).is_file() for f in files)
    assert not (out / "model.safetensors").exists() and not list(out.glob("*.tmp"))
    for f in files:  # bounded: no file over the limit unless it holds one tensor alone
        from safetensors import safe_open

        with safe_open(str(out / f), "pt") as st:
            if len(list(st.keys())) > 1:
                assert (out / f).stat().st_size < 40_000 + 10_000
    previous_export(path, case, tmp_path / "previous")
    configs = [json.loads((d / "config.json").read_text()) for d in (out, tmp_path / "previous")]
    for c in configs:  # FSDP2 unties the head (fsdp.py): tied in the one-process reference only
        c.pop("tie_word_embeddings")
    assert configs[0] == configs[1]
    a = AutoModelForImageTextToText.from_pretrained(out)
    b = AutoModelForImageTextToText.from_pretrained(tmp_path / "previous")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ids = torch.arange(1, 30)[None]
    assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)
