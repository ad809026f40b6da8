"""Which SDPA kernel CUDA runs for an attention call, and a warning (or an error) before the MATH one.

On CUDA, `F.scaled_dot_product_attention` runs the first kernel in torch's priority order whose
constraints the call meets (`select_sdp_backend`, aten/src/ATen/native/transformers/cuda/sdp_utils.cpp).
The default order is flash, memory-efficient, MATH, cuDNN. Recent torch puts cuDNN first on sm90 and
sm100 with cuDNN > 9.15. MATH is the unfused kernel: it builds the [B, H, Lq, Lk] scores, which is
O(L^2) memory (9 GiB in float32 for 28 heads of a 4k-token response over 20k keys). A
`causal_lower_right` bias (what `fused_attention.after_prompt` passes) first asks torch's flash check,
then the memory-efficient check, each directly. If both refuse, it builds its [Lq, Lk] bool mask and
calls SDPA with that mask (torch/nn/attention/bias.py).

`kernel(call, gpu)` is that walk, with torch's documented constraints written out for dense inputs:

- flash: sm80-sm121; float16/bfloat16; no tensor mask; q/k/v head dims equal and <= 256 (backward on
  sm86-89/sm120 with a head dim in (192, 224], or in (224, 256] with dropout, is refused);
  `is_causal` only with as many queries as keys; fewer key/value heads only with `enable_gqa`
  (dividing the query heads); last dimension of stride 1; no empty sequence.
- memory-efficient: sm50-sm121; float16/float32, bfloat16 from sm80; head dims a multiple of 8
  (half) or 4 (float32 on sm80+), with storage offsets aligned likewise; a tensor mask is taken;
  grouped-query heads are refused. The torch installed here (2.13) checks them with the
  no-grouped-query template (sdp_utils_cpp.h), and pytorch#191085 adds them later. The rule
  keeps the refusal for every version, and on a GPU torch's own check decides (below).
- cuDNN: sm80-sm121; float16/bfloat16; head dims <= 128 (recent torch and cuDNN take 256 on sm90 and
  sm100; the rule keeps 128) and a multiple of 8; a 2-D or 4-D mask
  (broadcastable, no gradient); fewer key/value heads when they divide the query heads; more than
  one key; not under `torch.use_deterministic_algorithms(True)`; dropout a multiple of 1/16.

`math_reason(call, gpu)` says why a call would run MATH (None when a fused kernel takes it). `Call`
and `Gpu` are plain descriptions, so the rule is tested on a CPU: on the calls a real forward
makes (tests/models/test_kernel_check.py), and with a planted call that falls back.

At run time `fused_attention.kernel_policy` enters `watch()` on CUDA. Every SDPA call of the
attention call sites is checked before it runs: packed rows, Ulysses, the vision windows, and
transformers' SDPA for the unpacked calls of a model on packed attention (generation). On a real GPU, torch's own `torch.backends.cuda.can_use_*` checks
decide whether a kernel takes the call (a newer torch may accept what the rule refuses), and the
rule says why not. A call that would fall back logs one warning per distinct reason, with its
shapes. Under `model.strict_kernels: true` (`set_strict`) it raises instead, and so it does with
`EASYVIDEOR1_FUSED_ATTENTION=1`, which the tests and scripts/gpu_check.py set. Strict mode also
refuses torch's MATH kernel (`sdpa_kernel`), so a call the rule misses still raises inside torch.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias, CausalVariant
from torch.overrides import TorchFunctionMode

log = logging.getLogger(__name__)

STRICT_ENV = "EASYVIDEOR1_FUSED_ATTENTION"
"""Environment variable: "1" makes a would-be MATH call an error (`strict`); set by the tests and gpu_check."""
HALF_DTYPES = (torch.float16, torch.bfloat16)
DEFAULT_ORDER = ("flash", "efficient", "math", "cudnn")
"""torch's default priority order (`torch._C._get_sdp_priority_order()`: 1, 2, 0, 3)."""
NAMES = {"flash": "flash", "efficient": "memory-efficient", "cudnn": "cuDNN", "math": "MATH"}
_BACKEND_IDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}  # torch's SDPBackend values


@dataclass(frozen=True)
class Call:
    """What an SDPA call passes that decides its CUDA kernel (dense inputs)."""

    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    dtype: torch.dtype
    mask: str = "none"
    """"none", "tensor", "lower_right" or "upper_left" (a `CausalBias`)."""
    mask_shape: tuple[int, ...] = ()
    mask_requires_grad: bool = False
    is_causal: bool = False
    dropout: float = 0.0
    enable_gqa: bool = False
    requires_grad: bool = False
    """Grad mode is on and an input requires grad (the backward's constraints apply)."""
    unit_stride: bool = True
    """q, k, v and a tensor mask have stride 1 in their last dimension."""
    offsets: tuple[int, int, int] = (0, 0, 0)
    """Storage offsets of q, k, v in elements (memory-efficient needs them aligned)."""

    @staticmethod
    def of(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> Call:
        """The description of `F.scaled_dot_product_attention(*args, **kwargs)`'s arguments."""
        del scale  # no kernel depends on it
        mask, shape, mask_grad, strides = "none", (), False, [query.stride(-1), key.stride(-1), value.stride(-1)]
        if isinstance(attn_mask, CausalBias):
            mask = "lower_right" if attn_mask.variant == CausalVariant.LOWER_RIGHT else "upper_left"
            shape = (attn_mask.seq_len_q, attn_mask.seq_len_kv)
        elif isinstance(attn_mask, torch.Tensor):
            mask, shape, mask_grad = "tensor", tuple(attn_mask.shape), attn_mask.requires_grad
            strides.append(attn_mask.stride(-1) if attn_mask.dim() else 1)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return Call(tuple(query.shape), tuple(key.shape), tuple(value.shape), query.dtype, mask, shape, mask_grad,
                    bool(is_causal), float(dropout_p), bool(enable_gqa), grad, all(s == 1 for s in strides),
                    (query.storage_offset(), key.storage_offset(), value.storage_offset()))

    def describe(self) -> str:
        mask = {"none": "no mask", "lower_right": "lower-right causal bias", "upper_left": "causal bias",
                "tensor": f"tensor mask {list(self.mask_shape)}"}[self.mask]
        kv = f"k/v {list(self.k)}" if self.k == self.v else f"k {list(self.k)}, v {list(self.v)}"
        flags = "".join([", is_causal" if self.is_causal else "", ", enable_gqa" if self.enable_gqa else "",
                         ", with grad" if self.requires_grad else ""])
        return f"q {list(self.q)} {str(self.dtype).removeprefix('torch.')}, {kv}, {mask}{flags}"

    def materialized(self) -> Call:
        """The call a lower-right bias makes when flash and memory-efficient refuse it: its [Lq, Lk] bool mask."""
        return replace(self, mask="tensor", mask_shape=(self.q[-2], self.k[-2]), mask_requires_grad=False,
                       is_causal=False)


@dataclass(frozen=True)
class Gpu:
    """What besides the call decides the kernel."""

    capability: tuple[int, int]
    order: tuple[str, ...] = DEFAULT_ORDER
    """torch's priority order (`torch._C._get_sdp_priority_order`)."""
    disabled: frozenset[str] = frozenset()
    """Kernels turned off (`sdpa_kernel`, `torch.backends.cuda.enable_*_sdp(False)`)."""
    deterministic: bool = False
    """`torch.use_deterministic_algorithms(True)` without warn_only (cuDNN refuses)."""
    cudnn: int = 91000
    """cuDNN runtime version (`torch.backends.cudnn.version()`); below 9.0 cuDNN attention is off."""

    @property
    def sm(self) -> str:
        return f"sm{self.capability[0]}{self.capability[1]}"

    @staticmethod
    def current(device: torch.device) -> Gpu:
        """The GPU of `device` and torch's kernel settings now (CUDA only)."""
        cuda = torch.backends.cuda
        flags = {"flash": cuda.flash_sdp_enabled(), "efficient": cuda.mem_efficient_sdp_enabled(),
                 "math": cuda.math_sdp_enabled(), "cudnn": cuda.cudnn_sdp_enabled()}
        order = getattr(torch._C, "_get_sdp_priority_order", None)
        names = tuple(_BACKEND_IDS[b] for b in order() if b in _BACKEND_IDS) if order else DEFAULT_ORDER
        deterministic = (torch.are_deterministic_algorithms_enabled()
                         and not torch.is_deterministic_algorithms_warn_only_enabled())
        return Gpu(_capability(device.index), names, frozenset(n for n, on in flags.items() if not on), deterministic,
                   torch.backends.cudnn.version() or 0)


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _between(cap: tuple[int, int], low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= cap <= high


def _dense(c: Call, singleton_ok: bool) -> str | None:
    """The dense-input checks every fused kernel makes (not the heads)."""
    if c.q[-2] == 0 or c.k[-2] == 0:
        return "an empty sequence"
    if not c.unit_stride and not (singleton_ok and c.q[-1] == 1):
        return "an input (or the mask) whose last dimension has a stride other than 1"
    return None


def _heads(c: Call, gqa: bool, same_kv: bool = True) -> str | None:
    if not c.q[0] == c.k[0] == c.v[0]:
        return "batch sizes of q, k, v differ"
    hq, hk, hv = c.q[-3], c.k[-3], c.v[-3]
    if c.enable_gqa and gqa:
        if (same_kv and hk != hv) or hq % hk or hq % hv:
            return f"{hq} query heads over {hk} key / {hv} value heads (they must divide the query heads)"
        return None
    if hq == hk == hv:
        return None
    if gqa:
        return f"{hq} query / {hk} key-value heads without enable_gqa"
    return f"{hq} query / {hk} key-value heads: takes no grouped-query heads"


def _flash(c: Call, g: Gpu) -> str | None:
    d = c.q[-1]
    if len(c.q) != 4 or len(c.k) != 4 or len(c.v) != 4:
        return "takes 4-D q/k/v only"
    if c.mask == "tensor":
        return "takes no tensor mask"
    if not (c.q[-1] == c.k[-1] == c.v[-1] and d <= 256):
        return f"head dims {c.q[-1]}/{c.k[-1]}/{c.v[-1]} (must be equal and <= 256)"
    if not _between(g.capability, (8, 0), (12, 1)):
        return f"runs on sm80-sm121 only, this GPU is {g.sm}"
    backward_limited = _between(g.capability, (8, 6), (8, 9)) or _between(g.capability, (12, 0), (12, 1))
    if c.requires_grad and backward_limited and not (d <= 192 or (c.dropout == 0 and d > 224)):
        return f"no backward with head dim {d} on {g.sm}"
    if c.is_causal and c.q[-2] != c.k[-2]:
        return "is_causal with unequal query and key lengths (torch gives flash square causal calls only)"
    if c.dtype not in HALF_DTYPES:
        return f"dtype {str(c.dtype).removeprefix('torch.')} (takes float16/bfloat16 only)"
    return _heads(c, gqa=True) or _dense(c, singleton_ok=True)


def _alignment(c: Call, g: Gpu) -> int:
    """torch's `minimum_gemm_alignment`, in elements."""
    half = c.dtype in HALF_DTYPES
    tensor_cores = g.capability[0] >= 8 or (g.capability[0] >= 7 and half)
    align = 4 if g.capability[0] >= 8 else 1
    return max(align, 128 // (16 if half else 32)) if tensor_cores else align


def _efficient(c: Call, g: Gpu) -> str | None:
    if not _between(g.capability, (5, 0), (12, 1)):
        return f"runs on sm50-sm121 only, this GPU is {g.sm}"
    if len(c.q) != 4 or len(c.k) != 4 or len(c.v) != 4:
        return "takes 4-D q/k/v only"
    align = _alignment(c, g)
    if c.q[-1] != c.k[-1] or c.q[-1] % align or c.v[-1] % align or not c.q[-1] or not c.v[-1]:
        return f"head dims {c.q[-1]}/{c.k[-1]}/{c.v[-1]} (q and k equal, each a multiple of {align})"
    if g.capability[0] >= 8 and any(o % align for o in c.offsets):
        return f"storage offsets not a multiple of {align} elements"
    dense = _dense(c, singleton_ok=False)
    if dense:
        return dense
    heads = _heads(c, gqa=False)
    if heads:
        return heads
    allowed = (torch.float16, torch.float32, torch.bfloat16) if g.capability[0] >= 8 else (torch.float16, torch.float32)
    if c.dtype not in allowed:
        return f"dtype {str(c.dtype).removeprefix('torch.')} on {g.sm}"
    return None


def _cudnn(c: Call, g: Gpu) -> str | None:
    if g.cudnn < 90000:
        return f"needs cuDNN 9 (this one is {g.cudnn or 'absent'})"
    if len(c.q) != 4 or len(c.k) != 4 or len(c.v) != 4:
        return "takes 4-D q/k/v only"
    if g.deterministic:
        return "not deterministic (torch.use_deterministic_algorithms)"
    if c.dtype not in (HALF_DTYPES if g.capability[0] >= 8 else (torch.float16,)):
        return f"dtype {str(c.dtype).removeprefix('torch.')} (takes float16/bfloat16 only)"
    if c.mask == "tensor":
        shape, target = c.mask_shape, (c.q[0], c.q[1], c.q[-2], c.k[-2])
        fits = len(shape) in (2, 4) and all(m in (t, 1) for m, t in zip(reversed(shape), reversed(target)))
        if c.mask_requires_grad or not fits:
            grad = " with grad" if c.mask_requires_grad else ""
            return f"a {len(shape)}-D mask{grad} (takes 2-D or 4-D, broadcastable, no grad)"
    if not _between(g.capability, (8, 0), (12, 1)):
        return f"runs on sm80-sm121 only, this GPU is {g.sm}"
    if c.dropout * 16 != int(c.dropout * 16):
        return f"dropout {c.dropout} (a multiple of 1/16 only)"
    dense = _dense(c, singleton_ok=True) or _heads(c, gqa=True, same_kv=False)
    if dense:
        return dense
    if c.q[0] > 65535 or c.q[1] > 65535:
        return "batch or heads above 65,535"
    if c.q[-1] > 128 or c.v[-1] > 128 or c.q[-1] % 8 or c.v[-1] % 8:
        return f"head dims {c.q[-1]}/{c.v[-1]} (<= 128 and a multiple of 8)"
    if c.k[-2] == 1:
        return "a single key"
    return None


CHECKS: dict[str, Callable[[Call, Gpu], str | None]] = {"flash": _flash, "efficient": _efficient, "cudnn": _cudnn}
Refuses = Callable[[str, Call], "str | None"]
"""(kernel name, call) -> why that kernel refuses the call, or None when it takes it."""


def _walk(c: Call, g: Gpu, refuses: Refuses) -> tuple[str, dict[str, str]]:
    """torch's dispatch for `c` (module docstring): the kernel it runs ("flash", "efficient", "cudnn",
    "math", or "none" when every allowed kernel refuses and torch raises), and why each kernel tried
    before it refused (keys: kernel names, a bias's direct tries prefixed "bias ")."""
    why: dict[str, str] = {}

    def refused(name, call):
        if name in g.disabled:
            return "turned off (sdpa_kernel / torch.backends.cuda)"
        return refuses(name, call)

    if c.mask == "lower_right" and c.q[-2] != c.k[-2]:
        direct = replace(c, mask="none", mask_shape=(), is_causal=False)
        for name in ("flash", "efficient"):
            reason = refused(name, direct)
            if reason is None:
                return name, why
            why[f"bias {name}"] = reason
        c = c.materialized()
    elif c.mask in ("lower_right", "upper_left"):
        c = replace(c, mask="none", mask_shape=(), is_causal=True)
    for name in g.order:
        if name == "math":
            if name not in g.disabled:
                return "math", why
            continue
        if name not in CHECKS:
            continue
        reason = refused(name, c)
        if reason is None:
            return name, why
        why[name] = reason
    return "none", why


def kernel(c: Call, g: Gpu) -> tuple[str, dict[str, str]]:
    """The kernel CUDA runs for `c` on `g` by the rule (module docstring), and why the kernels tried first refused."""
    return _walk(c, g, lambda name, call: CHECKS[name](call, g))


def _explain(c: Call, g: Gpu, chosen: str, why: dict[str, str]) -> str:
    parts = []
    if any(key.startswith("bias ") for key in why):
        direct = "; ".join(f"{NAMES[k[5:]]}: {v}" for k, v in why.items() if k.startswith("bias "))
        parts.append(f"the lower-right causal bias tried {direct}; then it built its [Lq, Lk] mask")
    parts += [f"{NAMES[k]}: {v}" for k, v in why.items() if not k.startswith("bias ")]
    if chosen == "math" and "cudnn" in g.order and g.order.index("cudnn") > g.order.index("math") \
            and "cudnn" not in g.disabled:
        parts.append("cuDNN: comes after MATH in torch's priority order")
    if chosen == "none":
        parts.append("MATH: turned off, so torch raises")
    return "; ".join(parts)


def math_reason(c: Call, g: Gpu) -> str | None:
    """Why `c` would run SDPA's MATH kernel on `g` (or find no kernel), by the rule; None when a fused one takes it."""
    chosen, why = kernel(c, g)
    return None if chosen in CHECKS else _explain(c, g, chosen, why)


# ---- run time ----

def _torch_refuses(args, kwargs, g: Gpu, can_use: dict[str, Callable] | None = None) -> Refuses:
    """`refuses` with torch's own checks deciding (`torch.backends.cuda.can_use_*` on the call's own tensors) and the
    rule giving the reason. `can_use`: kernel name -> f(SDPAParams) -> bool (torch's, unless a test passes its own)."""
    can_use = can_use or {"flash": torch.backends.cuda.can_use_flash_attention,
                          "efficient": torch.backends.cuda.can_use_efficient_attention,
                          "cudnn": getattr(torch.backends.cuda, "can_use_cudnn_attention", lambda params: False)}
    q, k, v = args[:3]
    given = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)

    def params(call: Call):
        if call.mask == "none":
            mask = None
        elif isinstance(given, torch.Tensor):
            mask = given
        else:  # the bias's own [Lq, Lk] bool mask, as a broadcast view of one row (stride 1 in its last dimension)
            mask = torch.ones(call.k[-2], dtype=torch.bool, device=q.device).expand(call.q[-2], call.k[-2])
        try:
            return torch.backends.cuda.SDPAParams(q, k, v, mask, call.dropout, call.is_causal, call.enable_gqa)
        except TypeError:  # torch before enable_gqa
            return torch.backends.cuda.SDPAParams(q, k, v, mask, call.dropout, call.is_causal)

    def refuses(name: str, call: Call) -> str | None:
        if can_use[name](params(call)):
            return None
        return CHECKS[name](call, g) or "refused by torch's own check (not by the rule here)"

    return refuses


_strict = False
_warned: set[str] = set()
_verdicts: dict[tuple[Call, Gpu], tuple[str, dict[str, str]]] = {}
"""torch's verdicts by call and GPU (`check` with `cache`): a decode step asks once, not once per layer."""


def set_strict(flag: bool) -> None:
    """`model.strict_kernels`: raise instead of warning when a CUDA attention call would run MATH."""
    global _strict
    _strict = bool(flag)


def strict() -> bool:
    """`model.strict_kernels`, or `EASYVIDEOR1_FUSED_ATTENTION=1` (tests, gpu_check)."""
    return _strict or os.environ.get(STRICT_ENV, "") not in ("", "0")


def check(args, kwargs, g: Gpu, refuses: Refuses | None = None, cache: bool = False) -> None:
    """Raise (under `strict()`) or warn once per distinct reason when the SDPA call `args, kwargs`
    would run MATH on `g`; `refuses` decides each kernel (default: the rule); `cache`: keep its
    verdict for equal calls on an equal GPU (`_verdicts`)."""
    c = Call.of(*args, **kwargs)
    verdict = _verdicts.get((c, g)) if cache else None
    if verdict is None:
        verdict = _walk(c, g, refuses or (lambda name, call: CHECKS[name](call, g)))
        if cache:
            if len(_verdicts) >= 4096:
                _verdicts.clear()
            _verdicts[(c, g)] = verdict
    chosen, why = verdict
    if chosen in CHECKS:
        return
    reason = _explain(c, g, chosen, why)
    message = (f"attention on CUDA ({g.sm}) would run SDPA's MATH kernel, O(L^2) memory ([B, H, Lq, Lk] scores), "
               f"for {c.describe()}: {reason}")
    if strict():
        raise RuntimeError(message + " (model.strict_kernels / EASYVIDEOR1_FUSED_ATTENTION refuse it)")
    if reason not in _warned:  # one warning per distinct reason; the shapes are the first call's
        _warned.add(reason)
        log.warning("%s (further calls for this reason are not logged; model.strict_kernels: true makes it an error)",
                    message)


class _Watch(TorchFunctionMode):
    def __init__(self, gpu: Gpu | None, can_use: dict[str, Callable] | None):
        super().__init__()
        self.gpu, self.can_use = gpu, can_use

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            query = args[0] if args else kwargs["query"]
            if self.gpu is not None:  # a given GPU: checked by the rule (or the given checks), on any device
                if self.can_use is None:
                    check(args, kwargs, self.gpu)
                else:
                    check(args, kwargs, self.gpu, _torch_refuses(args, kwargs, self.gpu, self.can_use), cache=True)
            elif query.is_cuda:  # run time: this GPU, torch's own checks decide
                g = Gpu.current(query.device)
                check(args, kwargs, g, _torch_refuses(args, kwargs, g), cache=True)
        return func(*args, **kwargs)


@contextmanager
def watch(gpu: Gpu | None = None, can_use: dict[str, Callable] | None = None):
    """Check every SDPA call made inside (`check`). Without `gpu`: CUDA calls only, on their GPU, torch's
    `can_use_*` deciding. With `gpu` (tests on a CPU): every call, as if on `gpu`, the rule deciding
    (or `can_use`, kernel name -> f(SDPAParams) -> bool, standing in for torch's)."""
    with _Watch(gpu, can_use):
        yield
