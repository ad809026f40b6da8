"""LoRA adapters on the policy (peft), and the three views of such a policy the rest needs.

`apply_lora` injects peft's LoRA layers into the loaded transformers model in place (the
transformers integration, `model.add_adapter`), so the model keeps its class and its module
names: FSDP2's units (`training/fsdp.py`), the log-prob passes (`model.model`, `model.lm_head`)
and the engines see the same model as in full fine-tuning. Every base parameter is frozen;
only the adapters (and `modules_to_save`) train, so only they get AdamW states. On the MoE
families the adapters go on attention (and Qwen3.5-MoE's shared expert); the routed experts (3-D
grouped parameters, no nn.Linear), the router and the shared-expert gate stay frozen (`GATES`).

- Reference model: `ReferenceView`, the policy with its adapters switched off for each call
  (TRL's and veRL's way): no second copy of the weights.
- Engine sync and merged export: `merged_state_items`, the HF-named weights with each adapter
  merged into its base weight in float32 (W + scale * B @ A, peft's `get_delta_weight` for a
  Linear) and each `modules_to_save` copy under the original name.
- Checkpoints and the PEFT adapter folder: `trainable_state`, the adapter parameters only.

Departure from peft's `get_peft_model`: no `PeftModel` wrapper (it renames every parameter
`base_model.model.*`, which FSDP units, checkpoints and vLLM's loader would all have to
strip); the PEFT folder written by `save_adapter` has peft's own names, so
`PeftModel.from_pretrained(base, folder)` loads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

ADAPTER = "default"  # peft's adapter name; one adapter per policy


# MoE gates left out unless named: a router's or a shared expert's gate picks or weighs experts
# (a low-rank update of a [4, H] or [1, H] gate is not one; under routing replay the router must
# stay the engine's). The routed experts never match: their grouped 3-D parameters are no nn.Linear.
GATES = ("gate", "shared_expert_gate")


def linear_targets(model, names: list[str], vision: bool) -> list[str]:
    """Full module names of the linear layers to adapt: those of the language model (and the
    vision tower with `vision`), restricted to `names` (last name component) when given; without
    `names`, every one but the MoE gates (`GATES`)."""
    inner = model.model
    scopes = [("model.language_model.", inner.language_model)]
    if vision:
        scopes.append(("model.visual.", inner.visual))
    found = [prefix + n for prefix, scope in scopes for n, m in scope.named_modules()
             if isinstance(m, torch.nn.Linear)
             and (n.rsplit(".", 1)[-1] in names if names else n.rsplit(".", 1)[-1] not in GATES)]
    if not found:
        raise ValueError(f"model.lora.target_modules={names} matches no linear layer of the "
                         f"{'language model or vision tower' if vision else 'language model'}")
    return found


def apply_lora(model, rank: int, alpha: float, dropout: float = 0.0, target_modules: list[str] = (),
               vision: bool = False, modules_to_save: list[str] = (), base_dtype: torch.dtype | None = None):
    """Freeze `model` and inject LoRA adapters of `rank` (scale `alpha / rank`) in place; returns it.

    B starts at zero (peft's default), so the adapted model computes exactly the base model
    until the first update. `base_dtype` (e.g. bf16, the compute dtype): the frozen parameters
    are stored in it; they never update, so they need no float32 master copy (half the memory
    of the base); the trainable ones keep the model's dtype (float32 masters).
    """
    from peft import LoraConfig

    targets = linear_targets(model, list(target_modules), vision)
    model.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                        modules_to_save=list(modules_to_save) or None, bias="none")
    with _adapters_kept_real(model, targets):
        model.add_adapter(config, adapter_name=ADAPTER)
    if base_dtype is not None:
        for p in model.parameters():
            if not p.requires_grad and p.is_floating_point():
                p.data = p.data.to(base_dtype)
    return model


@contextmanager
def _adapters_kept_real(model, targets: list[str]):
    """On a meta-device model (`models.meta_init`), peft draws each adapter on the CPU and then
    moves it to its base weight's device, losing the values. Inside the block each targeted meta
    weight is a CPU stand-in of the same shape and dtype with no storage (stride 0), so the adapters
    stay as drawn, from the same RNG draws as on a loaded model; the meta weights are put back."""
    swapped = []
    for name in targets:
        module = model.get_submodule(name)
        weight = module.weight
        if weight.is_meta:
            stand_in = torch.zeros((), dtype=weight.dtype).expand(weight.shape)
            module.weight = torch.nn.Parameter(stand_in, requires_grad=weight.requires_grad)
            swapped.append((module, weight))
    try:
        yield
    finally:
        for module, weight in swapped:
            weight.requires_grad_(module.weight.requires_grad)
            module.weight = weight


def base_name(name: str) -> str:
    """The HF name (as in the base checkpoint) a parameter of an adapted model starts from: the
    base weight of an adapted Linear, either copy of a `modules_to_save` module."""
    for part in (".base_layer.", f".modules_to_save.{ADAPTER}.", ".original_module."):
        name = name.replace(part, ".")
    return name


def has_adapters(model) -> bool:
    """Whether `model` carries LoRA adapters (`apply_lora`)."""
    return ADAPTER in (getattr(model, "peft_config", None) or {})


def _adapter_layers(model) -> list[torch.nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import ModulesToSaveWrapper

    return [m for m in model.modules() if isinstance(m, (BaseTunerLayer, ModulesToSaveWrapper))]


@contextmanager
def adapters_disabled(model):
    """Run `model` as its base model inside the block. peft's switch also flips the adapters'
    `requires_grad`; every flag is put back as it was (FSDP2 reads them at each all-gather)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    layers = _adapter_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for p, flag in flags:
            p.requires_grad_(flag)


class _WithoutAdapters:
    """Calls `module` with the adapters of `root` switched off (also when autograd recomputes a
    checkpointed chunk of the reference head during backward)."""

    def __init__(self, module: torch.nn.Module, root: torch.nn.Module):
        self.module, self.root = module, root

    def __call__(self, *args, **kwargs):
        with adapters_disabled(self.root):
            return self.module(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """`module.forward` (no module hooks: inside a `models.logprobs.head_pass`) with the adapters off."""
        with adapters_disabled(self.root):
            return self.module.forward(*args, **kwargs)


def viewed_module(part):
    """The module a `ReferenceView` part calls (the policy's own), or `part` itself."""
    return part.module if isinstance(part, _WithoutAdapters) else part


class ReferenceView:
    """The LoRA policy with its adapters off: the reference model of the KL terms, sharing the
    policy's (frozen) base weights. Offers what the log-prob passes use (`models/logprobs.py`):
    the backbone `model`, the head `lm_head`, `parameters()`, `modules()`, the HF `config`, and a full forward."""

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy
        self.config = policy.config
        self.model = _WithoutAdapters(policy.model, policy)
        self.lm_head = _WithoutAdapters(policy.lm_head, policy)

    def __call__(self, *args, **kwargs):
        with adapters_disabled(self.policy):
            return self.policy(*args, **kwargs)

    def parameters(self):
        return self.policy.parameters()

    def modules(self):  # the policy's: per-instance forwards (packing, routing) are installed once, shared
        return self.policy.modules()

    def named_modules(self, *args, **kwargs):
        return self.policy.named_modules(*args, **kwargs)


def _full(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`tensor` whole (an FSDP2 DTensor gathered: a collective); a floating one cast to `dtype`
    first, so that the gather moves `dtype`'s bytes (a bf16 gather: half a float32 one)."""
    tensor = tensor.detach()
    if dtype is not None and tensor.is_floating_point():
        tensor = tensor.to(dtype)  # a DTensor casts its local shard
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def merged_state_items(model, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of `model`'s weights as the engines and `from_pretrained` name them,
    FSDP2 DTensors gathered (a collective: every rank must run through all of it), floating
    tensors in `dtype` (None: as stored), cast before the gather.

    With adapters, each adapted Linear's weight is `W + scale * B @ A`, computed in float32
    and cast to `dtype` (None: W's); A and B are gathered as stored (they are small);
    `modules_to_save` give their trained copy under the original name.
    Without adapters: the state dict as it is.
    """
    adapted = has_adapters(model)
    pending: dict[str, dict[str, torch.Tensor]] = {}  # adapted Linear -> its W, A, B so far
    for name, tensor in model.state_dict().items():
        is_adapter = adapted and (f".lora_A.{ADAPTER}." in name or f".lora_B.{ADAPTER}." in name)
        if adapted and ".original_module." in name:
            continue
        tensor = _full(tensor, None if is_adapter else dtype)
        if not adapted:
            yield name, tensor
            continue
        if f".modules_to_save.{ADAPTER}." in name:
            yield name.replace(f".modules_to_save.{ADAPTER}.", "."), tensor
            continue
        for part, key in ((".base_layer.weight", "W"), (f".lora_A.{ADAPTER}.weight", "A"),
                          (f".lora_B.{ADAPTER}.weight", "B")):
            if name.endswith(part):
                prefix = name[: -len(part)]
                parts = pending.setdefault(prefix, {})
                parts[key] = tensor
                if len(parts) == 3:
                    del pending[prefix]
                    scale = model.get_submodule(prefix).scaling[ADAPTER]
                    w = parts["W"]
                    merged = w.float() + scale * (parts["B"].float() @ parts["A"].float())
                    yield f"{prefix}.weight", merged.to(dtype or w.dtype)
                break
        else:
            yield name.replace(".base_layer.", "."), tensor
    if pending:
        raise RuntimeError(f"adapted layers without all of base weight, lora_A and lora_B: {sorted(pending)[:3]}")


def trainable_names(model) -> list[str]:
    """Names of the parameters that train (the adapters and `modules_to_save` under LoRA)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def trainable_state(model) -> dict[str, torch.Tensor]:
    """The trainable parameters, gathered whole on every rank (a collective under FSDP2)."""
    return {n: _full(p).cpu() for n, p in model.named_parameters() if p.requires_grad}


def parameter_counts(model) -> tuple[int, int]:
    """(trainable, total) parameter counts (whole, not per-shard, under FSDP2)."""
    trainable = total = 0
    for p in model.parameters():
        n = p.numel()  # a DTensor's numel is the global one
        total += n
        trainable += n if p.requires_grad else 0
    return trainable, total


def save_adapter(model, state: dict[str, torch.Tensor], out_dir: str | Path, base_model: str) -> Path:
    """Write a PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`) from
    `trainable_state(model)`; `PeftModel.from_pretrained(base, out_dir)` loads it."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER)
    # PeftModel wraps the transformers model as `base_model.model`
    save_file({f"base_model.model.{k}": v.contiguous() for k, v in tensors.items()},
              str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = model.peft_config[ADAPTER]
    config.base_model_name_or_path = str(base_model)
    config.save_pretrained(str(out))
    return out
