"""Peak host memory (RSS) of each rank, phase by phase, of `easyvideor1 train` under torchrun.

Builds a Qwen2.5-VL-shaped model from the tiny model's config with larger text dims (default:
hidden 1024, 24 layers, 8 heads / 2 KV heads, MLP 3584: ~330M parameters), saves it as a local
HF folder, and runs the CLI twice with `torchrun --nproc-per-node 2` on a few text prompts:

  run 1: 2 steps, a checkpoint at step 2, the HF export at the end;
  run 2: the same command again, resuming from that checkpoint (its training is then done).

Per rank and phase it prints the peak RSS and the peak above the RSS the phase started at.
Phases are the CLI's own functions, seen by a profile hook (`sys.setprofile`, an observer: no
code is replaced), so the script measures whichever version of the package is on PYTHONPATH:
start-up (`build_run`), train (`train`, less the phases inside it), save (`checkpoint_run`),
resume (`maybe_resume`), export (`export_hf`). Method: at each phase boundary the rank reads its
peak RSS (`VmHWM` in /proc/self/status), returns freed heap pages to the OS (glibc `malloc_trim`)
and resets the peak (`echo 5 > /proc/self/clear_refs`), so each figure is the exact peak of that
phase alone, and its rise above the phase's entry RSS is what the phase itself added (Linux >= 4.0).
The ranks run with `MALLOC_MMAP_THRESHOLD_` fixed (see `MMAP_THRESHOLD`), so freed large buffers
leave RSS. Heavy imports are done before the
CLI starts (and the processor is loaded once, for its imports), so start-up measures loading,
not importing.

Also printed: the rank's resident shard (fp32 parameters / processes; with AdamW's two states)
and the full fp32 parameters + AdamW size (what one rank held at start-up before sharding).

Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/rank_memory_phases.py [--hidden 1024 --layers 24
       --heads 8 --kv-heads 2 --mlp 3584] [--procs 2] [--work DIR] [--until start-up] [--no-save]
Run it with PYTHONPATH pointing at the code to measure (e.g. PYTHONPATH=/work/main).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

GIB = 1 << 30
# glibc serves buffers above this with mmap and returns them on free. Its default threshold grows
# with each freed large buffer, after which FSDP's freed all-gather outputs fragment the heap
# and RSS shows a whole gathered model that is no longer live (a CPU allocator artefact; a GPU's
# caching allocator reuses the blocks). Fixed, RSS follows live memory.
MMAP_THRESHOLD = 128 << 10
# function name -> (its file's ending, phase); time outside all of them is "other"
PHASES = {"build_run": ("training/setup.py", "start-up"), "train": ("training/trainer.py", "train"),
          "checkpoint_run": ("training/trainer.py", "save"), "maybe_resume": ("training/trainer.py", "resume"),
          "export_hf": ("training/state/export.py", "export")}
ORDER = ["start-up", "train", "save", "resume", "export"]
TEXT = [{"problem_id": f"t{i}", "problem": f"What is {i} plus {i + 1}?", "answer": str(2 * i + 1),
         "problem_type": "numerical", "data_type": "text"} for i in range(4)]


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _reset_peak() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise, and a later phase would
    reuse what an earlier one freed without showing its own need), then reset the peak."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _libc():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()


class PhaseMeter:
    """Peak RSS per phase of this process: a stack of open phases, closed segment by segment."""

    def __init__(self, until: str | None):
        self.stack = ["other"]
        self.peak: dict[str, int] = {}
        self.above: dict[str, int] = {}
        self.entry = _status("VmRSS")
        self.until = until
        _reset_peak()

    def _close_segment(self) -> None:
        phase, peak = self.stack[-1], _status("VmHWM")
        self.peak[phase] = max(self.peak.get(phase, 0), peak)
        self.above[phase] = max(self.above.get(phase, 0), peak - self.entry)
        _reset_peak()
        self.entry = _status("VmRSS")

    def hook(self, frame, event, arg) -> None:
        if event not in ("call", "return"):
            return
        code = frame.f_code
        entry = PHASES.get(code.co_name)
        if entry is None or not code.co_filename.replace(os.sep, "/").endswith(entry[0]):
            return
        phase = entry[1]
        self._close_segment()
        if event == "call":
            self.stack.append(phase)
        elif self.stack[-1] == phase:
            self.stack.pop()
            if phase == self.until:
                self.finish()

    def finish(self) -> None:
        sys.setprofile(None)
        self._close_segment()
        rank = os.environ.get("RANK", "0")
        Path(f"{os.environ['RANK_MEMORY_OUT']}.{rank}.json").write_text(
            json.dumps({"peak": self.peak, "above": self.above}))
        if self.until:  # the phase asked for is measured: leave now (nothing collective is pending)
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(0)


def rank_main(argv: list[str], until: str | None) -> int:
    """One rank (under torchrun): the CLI in this process, watched phase by phase."""
    import peft  # noqa: F401  heavy imports before the first phase: start-up then measures loading
    import torch.distributed.fsdp  # noqa: F401
    import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl  # noqa: F401

    import easyvideor1.training.setup  # noqa: F401
    import easyvideor1.training.trainer  # noqa: F401
    from easyvideor1.cli import main
    from transformers import AutoProcessor

    AutoProcessor.from_pretrained(os.environ["RANK_MEMORY_MODEL"])  # its imports (cv2, ...): ~60 MB

    meter = PhaseMeter(until)
    sys.setprofile(meter.hook)
    try:
        code = main(argv)
    finally:
        if sys.getprofile() is not None:
            meter.finish()
    return code


def build_model(out: Path, hidden: int, layers: int, heads: int, kv_heads: int, mlp: int) -> dict[str, int]:
    """A Qwen2.5-VL-shaped model with random weights (seed 0) and the tiny tokenizer/processor;
    returns its parameter count and its largest tensor's."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer, GenerationConfig

    from easyvideor1.models.families import get_family
    from easyvideor1.models.tiny import SIZES, TINY_CONFIGS, TinySize, build_tiny_model
    from easyvideor1.models.tokenizer import SPECIAL_TOKENS

    build_tiny_model("qwen2_5_vl", out)  # tokenizer, processor, generation config
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokens = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    tiny = SIZES["tiny"]
    size = TinySize(hidden, layers, heads, kv_heads, tiny.vision_width, tiny.vision_depth, tiny.vision_heads,
                    tiny.vocab_size)
    config = TINY_CONFIGS["qwen2_5_vl"](size, tokens)
    config.architectures = [get_family("qwen2_5_vl").architecture]
    config.text_config.intermediate_size = mlp
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig.from_pretrained(out)
    model.save_pretrained(out)
    return {"params": sum(p.numel() for p in model.parameters()), "largest": max(p.numel() for p in model.parameters())}


def _config(work: Path, model: Path, save: bool) -> Path:
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in TEXT))
    cfg = work / "run.yaml"
    cfg.write_text(json.dumps({  # JSON is YAML
        "vision": {"family": "qwen2_5_vl"},
        "model": {"path": str(model), "dtype": "bfloat16"},
        # text only: no media admitted, so the 256-token prompts need no room for vision (config.prompt_budget_problem)
        "rollout": {"engine": "hf", "n": 2, "max_tokens": 4, "temperature": 1.0, "limit_videos": 0, "limit_images": 0},
        "algorithm": {"adv_estimator": "grpo", "disable_kl": False},
        "training": {"steps": 2, "rollout_batch_size": 2, "mini_batch_size": 2, "micro_batch_size": 2, "seed": 0},
        "data": {"train_files": [str(data)], "shuffle": False, "max_prompt_tokens": 256},
        "logging": {"out_dir": str(work / "out"), "progress": False},
        "checkpoint": {"every": 2 if save else 0, "resume": "auto", "export_hf": True},
    }))
    return cfg


def run_ranks(work: Path, procs: int, argv: list[str], until: str | None, tag: str) -> list[dict]:
    """`torchrun --nproc-per-node procs` of this script as the ranks; their phase figures."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
           "RANK_MEMORY_OUT": str(work / f"rss-{tag}"), "RANK_MEMORY_MODEL": str(work / "model")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs),
           __file__, "--rank-worker", *(["--until", until] if until else []), "--", *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"torchrun failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return [json.loads((work / f"rss-{tag}.{r}.json").read_text()) for r in range(procs)]


def measure(work: Path, procs: int = 2, until: str | None = None, hidden: int = 1024, layers: int = 24,
            heads: int = 8, kv_heads: int = 2, mlp: int = 3584, save: bool = True) -> dict:
    """Build the model under `work`, run the two CLI runs (one without `save`: no checkpoint, no
    resume); the figures per rank and phase."""
    model = work / "model"
    params = json.loads(subprocess.run(
        [sys.executable, __file__, "--build", str(model), *map(str, (hidden, layers, heads, kv_heads, mlp))],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    largest = 4 * params["largest"]  # bytes in float32
    cfg = _config(work, model, save)
    runs = [run_ranks(work, procs, ["train", str(cfg)], until, "run1")]
    if until is None and save:
        runs.append(run_ranks(work, procs, ["train", str(cfg), "checkpoint.export_hf=false"], None, "run2"))
    phases: list[dict[str, dict[str, int]]] = [{} for _ in range(procs)]
    for i, run in enumerate(runs):
        for rank, fig in enumerate(run):
            for phase in fig["peak"]:
                if phase == "other" or (i == 1 and phase != "resume") or (i == 0 and phase == "resume"):
                    continue  # run 1's resume finds nothing; run 2 measures only its resume
                phases[rank][phase] = {"peak": fig["peak"][phase], "above": fig["above"][phase]}
    n = params["params"]
    return {"params": n, "procs": procs, "largest_tensor": largest, "shard": 4 * n / procs,
            "shard_adam": 12 * n / procs, "full_adam": 12 * n, "ranks": phases}


def report(fig: dict) -> str:
    lines = [f"model: {fig['params'] / 1e6:.0f}M parameters, {fig['procs']} processes",
             f"full fp32 params + AdamW: {fig['full_adam'] / GIB:.2f} GiB; resident shard per rank: "
             f"{fig['shard'] / GIB:.2f} GiB params, {fig['shard_adam'] / GIB:.2f} GiB with AdamW; "
             f"largest tensor {fig['largest_tensor'] / GIB:.3f} GiB",
             "phase      " + "".join(f"rank {r}: peak (above entry)   " for r in range(fig["procs"]))]
    for phase in ORDER:
        cells = [fig["ranks"][r].get(phase) for r in range(fig["procs"])]
        if any(cells):
            lines.append(f"{phase:<10} " + "".join(
                f"{c['peak'] / GIB:6.2f} GiB ({c['above'] / GIB:+.2f} GiB)      " if c else " " * 31 for c in cells))
    return "\n".join(lines)


def main() -> int:
    if "--rank-worker" in sys.argv:
        args, rest = sys.argv[1:sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1:]
        until = args[args.index("--until") + 1] if "--until" in args else None
        return rank_main(rest, until)
    if "--build" in sys.argv:
        out, *dims = sys.argv[sys.argv.index("--build") + 1:]
        print(json.dumps(build_model(Path(out), *map(int, dims))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--mlp", type=int, default=3584)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--until", choices=ORDER, help="stop each rank after this phase (start-up: no training)")
    p.add_argument("--work", type=Path, help="working folder (default: a temporary one)")
    p.add_argument("--no-save", action="store_true", help="no checkpoint, no resume run (start-up, train, export)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = a.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        fig = measure(work, a.procs, a.until, a.hidden, a.layers, a.heads, a.kv_heads, a.mlp, save=not a.no_save)
    print(report(fig))
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
