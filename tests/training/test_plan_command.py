"""`easyvideor1 plan`: the shipped 8-GPU configs get a verdict, a setting that cannot fit gets the
setting to change first, and a wrong argument is one line (exit status 2, no traceback).

Runs the real command line (`cli.main`) in this process: the shapes come from config.json files
(the built-in table for the hub models the shipped configs name, a written folder, the tiny model).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from easyvideor1.cli import main
from easyvideor1.training.plan.shapes import tiny_config

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
