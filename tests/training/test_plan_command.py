"""`easyvideor1 plan`: the shipped 8-GPU configs get a verdict, a setting that cannot fit gets the
setting to change first, and a wrong argument is one line (exit status 2, no traceback).

Runs the real command line (`cli.main`) in this process: the shapes come from config.json files
(the built-in table for the hub models the shipped configs name, a written folder, the tiny model).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from easyvideor1.cli import main
from easyvideor1.config import load_config
from easyvideor1.data.synth import write_suite
from easyvideor1.errors import UserError
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.training.plan.shapes import read_shape, tiny_config
from easyvideor1.training.setup import build_run
from easyvideor1.vision.budget import clip_tokens, largest_video

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _plan(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["plan", *argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("config, model", [("qwen2_5_vl_7b_8gpu.yaml", "Qwen2.5-VL-7B-Instruct"),
                                           ("qwen3_vl_8b_8gpu.yaml", "Qwen3-VL-8B-Instruct")])
def test_shipped_8gpu_configs_fit_on_8_gpus_of_80_gib(capsys, config, model):
    code, out, _ = _plan(capsys, str(CONFIGS / config), "--gpus", "8", "--gpu-memory-gib", "80")
    assert code == 0
    assert f"built-in table: {model}" in out  # model.path is not local: the official shape
    for row in ("parameters", "gradients", "optimizer states", "reference model", "activations", "logits chunk",
                "vLLM during rollout"):
        assert f"\n  {row} " in out
    assert "gradient checkpointing on" in out and ", off " in out
    assert "verdict: fits" in out


def test_without_checkpointing_the_7b_config_does_not_fit_and_says_what_to_change(capsys):
    code, out, _ = _plan(capsys, str(CONFIGS / "qwen2_5_vl_7b_8gpu.yaml"), "model.gradient_checkpointing=false")
    assert code == 0
    assert "verdict: does not fit: the update needs" in out
    assert "change first: model.gradient_checkpointing=true" in out


def test_a_too_small_vllm_budget_gets_a_lower_share(capsys):
    code, out, _ = _plan(capsys, str(CONFIGS / "qwen3_vl_8b_8gpu.yaml"), "rollout.gpu_memory_utilization=0.9",
                         "--gpu-memory-gib", "40")
    assert code == 0
    assert "does not fit: the rollout needs" in out and "rollout.gpu_memory_utilization=0." in out


def test_local_config_json_and_the_default_tiny_model(capsys, tmp_path):
    tiny_config("qwen3_vl").save_pretrained(tmp_path)
    code, out, _ = _plan(capsys, f"model.path={tmp_path}", "vision.family=qwen3_vl", "--gpus", "1")
    assert code == 0 and f"config.json at {tmp_path / 'config.json'}" in out and "verdict: fits" in out
    code, out, _ = _plan(capsys, "--gpus", "2", "--gpu-memory-gib", "24")  # no config: the demo's tiny model
    assert code == 0 and "the tiny qwen2_5_vl model" in out and "verdict: fits" in out


GIB = 2**30


def test_the_7b_plan_counts_the_whole_run(capsys, tmp_path):
    """The rows the review found missing, each against a hand count for Qwen2.5-VL-7B (8.29B
    parameters) on 8 GPUs of 80 GiB: the root unit FSDP2 keeps gathered (embedding 152064 x 3584,
    the merger 5120 x 5120 + 5120 x 3584 with biases and norm, the patch embedding 1280 x 3 x 2 x
    14 x 14, the final norm) in bf16; AdamW's float32 temporary of the trainable shard; vLLM's
    share against its bf16 weights; host RAM with vLLM asleep in pinned memory; a checkpoint of
    float32 weights + two AdamW moments (12 bytes a parameter: ~99 GB, the review's figure)."""
    code, out, _ = _plan(capsys, str(CONFIGS / "qwen2_5_vl_7b_8gpu.yaml"), f"logging.out_dir={tmp_path / 'run'}")
    assert code == 0
    p = read_shape("Qwen2.5-VL-7B-Instruct").parameters
    root = 152064 * 3584 + (1280 + 5120 * 5120 + 5120 + 5120 * 3584 + 3584) + 1280 * 3 * 2 * 14 * 14 + 3584
    rows = {line[2:24].strip(): float(line[24:32]) for line in out.splitlines() if line.startswith("  ") and
            line[24:32].strip().replace(".", "").isdigit()}
    assert rows["root unit"] == pytest.approx(2 * root / GIB, abs=0.01)
    assert rows["AdamW step temporaries"] == pytest.approx(4 * p / 8 / GIB, abs=0.01)
    assert rows["optimizer step peak"] == pytest.approx(
        rows["parameters"] + rows["gradients"] + rows["optimizer states"] + rows["AdamW step temporaries"]
        + rows["vLLM during update"] + rows["runtime"], abs=0.02)
    assert f"(weights {2 * p / GIB:.1f}," in out and "): enough" in out
    assert f"host RAM per node (8 GPUs): vLLM asleep (pinned) {8 * 2 * p / GIB:.1f} GiB" in out
    assert f"checkpoints: {12 * p / GIB:.1f} GiB each, {3 * 12 * p / GIB:.1f} GiB for checkpoint.keep=2" in out
    assert 98e9 < 12 * p < 101e9
    # vision tokens as the sampler counts them (the old plan dropped the temporal patch: 12,288 planned
    # against 19,968-21,376 admitted for a 64-s clip before the config's total-pixel cap)
    cfg = load_config(str(CONFIGS / "qwen2_5_vl_7b_8gpu.yaml"))
    largest, clip = largest_video(cfg.vision), clip_tokens(cfg.vision, 64, 1080, 1920)
    assert f"1 prompt(s) of 16384, {largest.vision_tokens} of them vision" in out
    assert f"a 64-s 1080p clip at 30 fps takes {clip}" in out and clip <= largest.tokens <= 16384


def test_vllm_never_gets_less_than_it_needs_to_start(capsys):
    """12 GiB of an 80 GiB GPU (0.15) cannot hold vLLM's 15.4 GiB of bf16 7B weights: the plan says
    so (the old plan said "fits"), and the advice is the least share that holds them, never lower."""
    code, out, _ = _plan(capsys, str(CONFIGS / "qwen2_5_vl_7b_8gpu.yaml"), "rollout.gpu_memory_utilization=0.15")
    assert code == 0 and "verdict: does not fit: vLLM needs 18." in out and "its share is 12.0" in out
    share = float(out.split("change first: rollout.gpu_memory_utilization=")[1][:4])
    assert 0.23 < share <= 0.3  # 18.5 / 80 = 0.231, in steps of 0.05


def test_separate_placement_plans_the_trainers_and_the_rollout_gpu(capsys):
    code, out, _ = _plan(capsys, str(CONFIGS / "qwen2_5_vl_7b_8gpu.yaml"), "rollout.placement=separate")
    assert code == 0 and "separate placement: 7 GPU(s) train (the state shards over them), 1 generate" in out
    rows = dict(line.split(None, 1) for line in (x.replace("vLLM during ", "vLLM_during_").replace(
        "rollout GPU peak", "rollout_GPU_peak") for x in out.splitlines() if x.startswith("  ")))
    assert float(rows["vLLM_during_rollout"]) == 0.0  # the trainers' GPUs hold no engine
    assert float(rows["rollout_GPU_peak"].split()[0]) == pytest.approx(0.6 * 80 + 2.0)  # vLLM's share + runtime
    assert "vLLM asleep (pinned) 0.0 GiB" in out


def test_a_run_whose_checkpoints_cannot_fit_its_disk_refuses_at_start(capsys, tmp_path):
    """`plan` and `train` see the same disk: with checkpoint.keep so high that no disk holds the
    checkpoints, plan says NOT enough and `build_run` refuses before it reads a weight, naming the
    sizes and the fixes (every disk here is real: tmp_path's)."""
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    data = write_suite(tmp_path / "data", num_train=2, num_val=0, seed=0)["train"]
    # float32: no process group of one (bf16's FSDP2 policy makes one, which would outlive this test)
    overrides = [f"model.path={model}", "model.dtype=float32", f"logging.out_dir={tmp_path / 'run'}",
                 f"data.train_files=[{data}]", "checkpoint.every=1", "checkpoint.keep=100000000"]
    code, out, _ = _plan(capsys, *overrides, "--gpus", "1")
    assert code == 0 and "GiB for checkpoint.keep=100000000 + the one being written" in out
    assert out.rstrip().endswith("NOT enough: the run refuses to start")
    with pytest.raises(UserError, match=r"checkpoints of this run take [\d.]+ GiB each, .* free .*lower "
                                        r"checkpoint.keep"):
        build_run(load_config(None, overrides))
    build_run(load_config(None, overrides[:-1] + ["checkpoint.keep=2"]))  # fits


@pytest.mark.parametrize("argv, needle", [
    (["--gpus", "0"], "--gpus 0"),
    (["--gpu-memory-gib", "-1"], "--gpu-memory-gib -1"),
    (["--gpus", "eight"], "'eight'"),
    (["nofile.yaml"], "nofile.yaml"),
    (["training.stepz=1"], "stepz"),
    (["model.path=/models/NoSuchModel"], "model.path /models/NoSuchModel: no config.json there"),
    (["--model-config", "tiny:llama"], "--model-config tiny:llama"),
    (["training.sequence_parallel_size=3", "--gpus", "8"], "sequence_parallel_size=3 must divide --gpus 8"),
])
def test_bad_argument_is_one_line(capsys, argv, needle):
    code, out, err = _plan(capsys, *argv)
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("easyvideor1 plan:"), err
    assert needle in err


# Qwen3-VL-30B-A3B by hand (its config.json: text hidden 2048, 48 layers, 32/4 heads of 128, 128 experts
# of width 768, top-8, vocab 151936, untied; Qwen3-VL's vision tower with out_hidden 2048).
E, K, H, I, L, V = 128, 8, 2048, 768, 48, 151936
EXPERTS = E * (2 * I * H + H * I)  # gate_up_proj [E, 2I, H] + down_proj [E, H, I] of one layer
ATTENTION = H * 32 * 128 + 2 * H * 4 * 128 + 32 * 128 * H + 2 * 128  # q, k, v, o, q/k norms
LAYER = ATTENTION + E * H + EXPERTS + 2 * H  # + router [E, H], the two RMSNorms
VISION_BLOCK = 4 * 1152 + (1152 * 3456 + 3456) + (1152 * 1152 + 1152) + (1152 * 4304 + 4304) + (4304 * 1152 + 1152)
MERGER = (4608 * 4608 + 4608) + (4608 * 2048 + 2048)  # 2 x 2 patches of 1152 -> 2048
VISION = (27 * VISION_BLOCK + 3 * 2 * 16 * 16 * 1152 + 1152 + 2304 * 1152  # blocks, patch embedding, positions
          + MERGER + 2 * 1152 + 3 * (MERGER + 2 * 4608))  # merger (norm of 1152), 3 deepstack mergers (norm of 4608)


def test_the_30b_a3b_shape_counts_its_experts_as_a_hand_count():
    s = read_shape("Qwen3-VL-30B-A3B-Instruct")  # the built-in table: no weights on disk
    assert (s.experts, s.top_k, s.expert_intermediate, s.shared_intermediate, s.sparse_layers) == (E, K, I, 0, L)
    assert s.vision_parameters == VISION == 538_631_408
    assert s.parameters == L * LAYER + 2 * V * H + H + VISION == 31_070_754_032  # "31B"
    assert s.expert_parameters == L * EXPERTS == 28_991_029_248
    assert s.largest_unit == LAYER and s.unit_experts == EXPERTS  # FSDP2 gathers a layer with all 128 experts
    assert s.active_parameters == L * (LAYER - EXPERTS + K * EXPERTS // E) + 2 * V * H + H  # Qwen's "A3B": 3.35B
    assert s.intermediate == K * I  # the MLP width a token passes through


def _rows(out: str) -> dict[str, float]:
    return {line[2:24].strip(): float(line[24:32]) for line in out.splitlines() if line.startswith("  ") and
            line[24:32].strip().replace(".", "").isdigit()}


def test_the_shipped_30b_a3b_config_loads_and_fits_8_gpus_of_80_gib_with_its_experts_gathered(capsys):
    cfg = load_config(str(CONFIGS / "qwen3_vl_30b_a3b_8gpu.yaml"))  # the prompt-budget check included
    assert cfg.vision.family == "qwen3_vl_moe" and cfg.model.path.endswith("Qwen3-VL-30B-A3B-Instruct")
    code, out, _ = _plan(capsys, str(CONFIGS / "qwen3_vl_30b_a3b_8gpu.yaml"), "--gpus", "8", "--gpu-memory-gib", "80")
    assert code == 0 and "built-in table: Qwen3-VL-30B-A3B-Instruct" in out
    assert "48 MoE layers of 128 experts of width 768, top-8: 28.99B in experts, 3.35B" in out
    rows = _rows(out)
    # bf16: the layer computed, the next one prefetched and the gradient, each with its 128 experts
    assert rows["expert unit gathered"] == pytest.approx(3 * 2 * EXPERTS / GIB, abs=0.01)  # 3.38 GiB
    assert rows["FSDP buffers"] == pytest.approx(3 * 2 * (LAYER - EXPERTS) / GIB, abs=0.01)
    p = L * LAYER + 2 * V * H + H + VISION
    assert rows["parameters"] == pytest.approx(4 * p / 8 / GIB, abs=0.01)  # every expert's float32 shard
    assert rows["optimizer states"] == pytest.approx(8 * p / 8 / GIB, abs=0.01)
    assert rows["update peak"] == pytest.approx(sum(rows[r] for r in (
        "parameters", "gradients", "optimizer states", "FSDP buffers", "expert unit gathered", "root unit",
        "reference model", "activations", "vLLM during update", "runtime"))
        + max(rows["layer backward"], rows["logits chunk"]), abs=0.03)
    assert f"(weights {2 * p / 4 / GIB:.1f}," in out  # vLLM holds all experts, over 4 tensor-parallel ranks
    assert "verdict: fits" in out


def test_one_vllm_engine_per_gpu_cannot_hold_the_30b_a3b_experts_and_the_plan_says_what_to_change(capsys):
    code, out, _ = _plan(capsys, str(CONFIGS / "qwen3_vl_30b_a3b_8gpu.yaml"), "rollout.tensor_parallel_size=1",
                         "rollout.gpu_memory_utilization=0.6")
    assert code == 0 and f"(weights {2 * (L * LAYER + 2 * V * H + H + VISION) / GIB:.1f}," in out and "): short" in out
    assert "verdict: does not fit: the rollout needs" in out
    assert "change first: rollout.tensor_parallel_size=2 rollout.gpu_memory_utilization=0.40" in out
    code, out, _ = _plan(capsys, str(CONFIGS / "qwen3_vl_30b_a3b_8gpu.yaml"), "rollout.tensor_parallel_size=2",
                         "rollout.gpu_memory_utilization=0.40")
    assert code == 0 and "verdict: fits" in out


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "qwen3_5_moe"])
def test_a_tiny_moe_models_plan_counts_every_parameter_of_the_built_model(tmp_path, family):
    """The plan's counts of a tiny MoE model written to disk equal its tensors: all parameters, the
    routed experts (gate_up_proj, down_proj) and, in Qwen3.5-MoE, the shared expert beside them."""
    from transformers import AutoModelForImageTextToText

    folder = build_tiny_model(family, tmp_path / family, seed=0)
    model = AutoModelForImageTextToText.from_pretrained(folder)
    s = read_shape(str(folder))
    assert s.parameters == sum(p.numel() for p in model.parameters())
    experts = [p for name, p in model.named_parameters() if ".mlp.experts." in name]
    assert s.expert_parameters == sum(p.numel() for p in experts) > 0
    E_, two_i, H_ = experts[0].shape  # gate_up_proj [E, 2I, H]
    assert (s.experts, s.expert_intermediate, s.hidden) == (E_, two_i // 2, H_)
    text = model.config.get_text_config()
    assert s.top_k == text.num_experts_per_tok < s.experts
    shared = [p for name, p in model.named_parameters() if ".mlp.shared_expert.gate_proj." in name]
    assert s.shared_intermediate == (shared[0].shape[0] if shared else 0) and bool(shared) == (family == "qwen3_5_moe")
    language = sum(p.numel() for name, p in model.named_parameters() if ".visual." not in f".{name}")
    unrouted = sum(p.numel() for p in experts) * (s.experts - s.top_k) // s.experts
    assert s.active_parameters == language - unrouted < s.parameters - s.vision_parameters
