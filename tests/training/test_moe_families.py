"""The mixture-of-experts families (qwen3_vl_moe, qwen3_5_moe) through the trainer: two real steps
with the HF engine, export, and an evaluation of the exported folder; FSDP2 on two processes
equal to one; LoRA that touches no expert; a checkpoint that resumes exactly (resuming on another
number of processes is family-independent: tests/training/test_sharded_checkpoints.py); a run
from the frame cache equal to decoding. Tiny models from `build_tiny_model` (4 experts, top-2,
every layer sparse), videos from `write_suite`, float32 as the dense families' runs."""

import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file

from easyvideor1.config import load_config
from easyvideor1.data.loading import load_samples
from easyvideor1.evaluation.evaluator import EvalOptions, Evaluator
from easyvideor1.evaluation.settings import DecodingSettings
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.setup import build_run
from easyvideor1.training.state.export import export_model
from easyvideor1.training.trainer import train
from easyvideor1.vision.cache_build import build_cache
from easyvideor1.vision.config import VisionConfig
from test_distributed import TEXT, TIMEOUT_S, UPDATE_KEYS, _env, same_steps, synth_rows, write_config
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

MOE = ("qwen3_vl_moe", "qwen3_5_moe")
EXPERTS = (".mlp.experts.", ".mlp.gate.")  # the grouped experts and the router


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """8 prompts in file order: each batch of 4 holds two videos (or a video and an image) and a text prompt."""
    root = tmp_path_factory.mktemp("moe")
    rows = synth_rows(root)
    video = [r for r in rows if r["data_type"] == "video"]
    image = [r for r in rows if r["data_type"] == "image"]
    ordered = video[:2] + TEXT + [image[0], TEXT[0] | {"problem_id": "text-9"}, image[1], video[0] | {"problem_id": "v9"}]
    path = root / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ordered))
    return root, path


def _vision(family):
    return VisionConfig(family=family, max_frames=8, video_min_pixels=3136, video_max_pixels=12544,
                        image_min_pixels=3136, image_max_pixels=12544)


@pytest.mark.parametrize("family", MOE)
def test_moe_trains_exports_and_evaluates(family, mixed, tmp_path):
    _, data = mixed
    model = build_tiny_model(family, tmp_path / "model", seed=0)
    out = tmp_path / "out"
    run = build_run(load_config(str(write_config(tmp_path, model, data, out, vision__family=family,
                                                 rollout__parity_check_every=1))))
    assert run.model.dtype == torch.float32
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    train(run)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["update/grad_norm"] > 0 for r in rows)
    gaps = [v for r in rows for k, v in r.items() if k.startswith("parity/max_gap/")]
    # the HF engine's log-probs are the trainer's (same routing, banned pads on both sides): float32
    # rounding only, measured <= 4.8e-7; the dense families' engine-vs-trainer bound (test_hf_engine.py)
    assert gaps and max(gaps) < 1e-4, gaps
    moved = {n for n, p in run.model.named_parameters() if not torch.equal(before[n], p.detach())}
    for part in (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj", ".mlp.gate.weight", "visual"):
        assert any(part in n for n in moved), f"{part} got no update"

    # export: a folder `from_pretrained` loads back to the trained weights (Qwen3.5-MoE's grouped
    # experts are written one tensor per expert, as its released checkpoints are)
    exported = export_model(run, tmp_path / "hf_model", "test")
    from transformers import AutoModelForImageTextToText

    loaded = AutoModelForImageTextToText.from_pretrained(exported, dtype=torch.float32).state_dict()
    trained = run.model.state_dict()
    assert set(loaded) == set(trained)
    for name, tensor in trained.items():
        assert torch.equal(loaded[name], tensor), name

    # eval: the exported model loads in the evaluator and answers every sample
    ev = Evaluator(str(exported), engine="hf", preset="qwen2_5_vl_greedy",
                   options=EvalOptions(out_dir=str(tmp_path / "eval"), cache_mode="realtime", dtype="float32",
                                       asynchronous=False, max_batch=4),
                   sampling=DecodingSettings(temperature=0, max_new_tokens=8), vision=_vision(family))
    ev.run([str(data)])
    answers = [json.loads(l) for l in (tmp_path / "eval" / "file-mixed.jsonl").read_text().splitlines() if l.strip()]
    assert len(answers) == 8 and all(r["status"] == "ok" and r["response"] for r in answers), answers


def test_lora_on_a_moe_family_leaves_every_expert_and_router_alone(mixed, tmp_path):
    """Adapters go on the attention and shared-expert linears; the grouped experts (3-D parameters,
    no nn.Linear), the router and the shared-expert gate get none and stay as loaded."""
    _, data = mixed
    model = build_tiny_model("qwen3_5_moe", tmp_path / "model", seed=0)
    out = tmp_path / "out"
    cfg = write_config(tmp_path, model, data, out, vision__family="qwen3_5_moe", model__lora={"rank": 4, "alpha": 8.0},
                       training__lr=1e-2)
    run = build_run(load_config(str(cfg)))
    trainable = [n for n, p in run.model.named_parameters() if p.requires_grad]
    adapted = {n.split(".lora_")[0] for n in trainable}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert any(".self_attn." in n for n in adapted) and any(".shared_expert." in n for n in adapted)
    assert not any(any(part in n for part in EXPERTS) or n.endswith("shared_expert_gate") for n in adapted), adapted
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    train(run)
    after = dict(run.model.named_parameters())
    moved = {n for n, p in after.items() if not torch.equal(before[n], p.detach())}
    assert any(".lora_B." in n for n in moved)
    experts = [n for n in after if any(part in n for part in EXPERTS)]
    assert experts and not moved & set(experts)
    assert moved <= set(trainable)


def test_fsdp_two_processes_equal_one_process_qwen3_vl_moe(mixed, tmp_path):
    """Each decoder layer one FSDP2 unit with its experts (`training.fsdp`): the 4 experts' grouped
    parameters sharded on dim 0, 2 per rank. Rank 0's first micro-batch holds two videos, rank 1's
    two text prompts."""
    _, data = mixed
    model = build_tiny_model("qwen3_vl_moe", tmp_path / "model", seed=0)
    outs = {k: tmp_path / k for k in ("one", "two")}
    cfgs = {k: write_config(tmp_path, model, data, out, vision__family="qwen3_vl_moe",
                            checkpoint={"every": 0, "resume": "never", "export_hf": True})
            for k, out in outs.items()}
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)
    launchers = {"one": [], "two": ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]}
    for k, launcher in launchers.items():  # --standalone: the rendezvous takes a free port
        proc = forkserver.run([sys.executable, *launcher, "-m", "easyvideor1.cli", "train", str(cfgs[k])],
                              capture_output=True, text=True, env=_env(), timeout=TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr[-6000:]
    w1, w2 = (load_file(str(out / "hf_model" / "model.safetensors")) for out in outs.values())
    w0 = load_file(str(model / "model.safetensors"))
    assert set(w1) == set(w2) == set(w0)
    for name in w1:
        assert torch.allclose(w1[name], w2[name], rtol=1e-4, atol=1e-5), name
    assert all(not torch.equal(w0[n], w2[n]) for n in w2 if any(part in n for part in EXPERTS))
    same_steps(outs["one"], outs["two"], UPDATE_KEYS, 2)


class _Killed(Exception):
    pass


def test_moe_checkpoint_resumes_exactly(mixed, tmp_path):
    """qwen3_vl_moe, 3 steps with a checkpoint after step 2: a run killed after step 3's update (before
    its checkpoint) and resumed (`resume: auto`) ends with the parameters of the uninterrupted run,
    grouped experts and routers included. The checkpoint holds no routes: the batch of step 3 is
    generated again after the resume and records its own (routes live only within a step)."""
    _, data = mixed
    model = build_tiny_model("qwen3_vl_moe", tmp_path / "model", seed=0)

    def run_of(name):
        return build_run(load_config(str(write_config(tmp_path, model, data, tmp_path / name, steps=3,
                                                      vision__family="qwen3_vl_moe",
                                                      checkpoint={"every": 2, "resume": "auto"}))))

    straight = run_of("straight")
    assert straight.ctx.routing_replay
    start = {n: p.detach().clone() for n, p in straight.model.named_parameters()}
    train(straight)

    def kill(step, _):
        if step == 3:
            raise _Killed

    with pytest.raises(_Killed):
        train(run_of("killed"), on_step=kill)
    ckpts = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    assert ckpts == ["step-000002"], ckpts
    shard = load_file(str(tmp_path / "killed" / "checkpoints" / "step-000002" / "model.rank00000.safetensors"))
    assert any(".mlp.experts.gate_up_proj" in n for n in shard) and any(".mlp.gate." in n for n in shard)
    resumed = run_of("killed")
    train(resumed)
    assert resumed.step == 3 and len(resumed.history) == 1  # it ran step 3 only: it resumed from step 2
    a, b = dict(straight.model.named_parameters()), dict(resumed.model.named_parameters())
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name].detach(), b[name].detach()), name
    assert all(not torch.equal(start[n], a[n].detach()) for n in a if any(part in n for part in EXPERTS))


def test_moe_run_from_a_frame_cache_equals_decoding(mixed, tmp_path):
    """A qwen3_5_moe run reading a cache built for its family (`cache_only`: every frame from the cache)
    logs the same step-1 metrics as one decoding each video (`realtime`)."""
    _, data = mixed
    family = "qwen3_5_moe"
    model = build_tiny_model(family, tmp_path / "model", seed=0)
    report = build_cache(load_samples(data), _vision(family), tmp_path / "cache", workers=0, progress=False)
    assert report.failed_samples == 0 and report.built > 0
    rows = {}
    for mode in ("cache_only", "realtime"):
        out = tmp_path / mode
        train(build_run(load_config(str(write_config(tmp_path, model, data, out, steps=1, vision__family=family,
                                                     data__cache_dir=str(tmp_path / "cache"),
                                                     data__cache_mode=mode)))))
        rows[mode] = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    cached, decoded = ({k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "timestamp"))}
                       for r in rows.values())
    assert cached == decoded
    assert {"actor/pg_loss", "update/grad_norm", "moe/router_agreement"} <= set(decoded), sorted(decoded)
