"""Orchestration of the GPU check (the parent process): carried wheels, synthetic data per
workload, one child process per model under the deadline, the table and `$OUT/gpu_check.json`."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from gpucheck.shapes import workload

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def install_wheels(wheel_dir: Path, work: Path) -> Path:
    """pip-install the carried wheels into `work/site` (no index, no deps); return that folder."""
    site = work / "site"
    wheels = sorted(str(p) for p in wheel_dir.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"gpu_check: no .whl files in {wheel_dir}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    *wheels], check=True)
    return site


def child_env(extra_path: list[str]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_WAIT_POLICY="PASSIVE", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
               EASYVIDEOR1_FUSED_ATTENTION="1")  # packed attention refuses SDPA's MATH kernel: a fallback raises
    return env


def run_child(name: str, args, work: Path, env: dict, timeout: float) -> dict:
    cmd = [sys.executable, str(SCRIPT), "--child", name, "--work", str(work),
           "--steps", str(args.steps), "--dtype", args.dtype, "--peak-tflops", str(args.peak_tflops),
           *(["--tiny"] if args.tiny else []), *(["--cpu"] if args.cpu else []),
           *[f"--layers={x}" for x in args.layers]]
    log = work / f"log_{name}.txt"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:  # also when this process is stopped (SIGTERM -> SystemExit): leave no orphan on the GPU
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    res_path = work / f"result_{name}.json"
    result = json.loads(res_path.read_text()) if res_path.is_file() else {"model": name, "steps": []}
    result["seconds"] = time.perf_counter() - t0
    if rc is None:
        result["status"] = f"timeout after {timeout:.0f} s (was {result.get('status', 'starting')})"
    elif rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-30:]
        result["status"] = f"failed (exit {rc}, was {result.get('status', 'starting')})"
        result["log_tail"] = tail
    return result


def _fmt(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def table(results: list[dict]) -> str:
    head = ("model", "layers", "params_B", "fsdp2", "dtype", "step1_s", "step_s", "rollout_s", "update_s",
            "peak_GiB", "tok/s", "upd_tok/s", "MFU", "MFU_6ND", "fused", "status")
    rows = [head]
    for r in results:
        last = r["steps"][-1] if r.get("steps") else {}
        first = r["steps"][0] if r.get("steps") else {}
        layers = f"{r.get('text_layers', '?')}/{r.get('released_text_layers', '?')}"
        rows.append((r["model"], layers, _fmt(r.get("params", 0) / 1e9, ".2f"), str(r.get("fsdp2", "-")),
                     r.get("param_dtype", "-"), _fmt(first.get("step_s"), ".2f"), _fmt(last.get("step_s"), ".2f"),
                     _fmt(last.get("rollout_s"), ".2f"), _fmt(last.get("update_s"), ".2f"),
                     _fmt(last.get("peak_gib"), ".1f"), _fmt(last.get("tokens_per_s"), ".0f"),
                     _fmt(last.get("update_tokens_per_s"), ".0f"), _fmt(last.get("mfu"), ".1%"),
                     _fmt(last.get("mfu_dense"), ".1%"), str(r.get("fused_attention", "-")), r.get("status", "?")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


def check(args, names: list[str], work: Path, out: dict, write_out, started: float) -> int:
    """Data once, then each model in its own process; the table and JSON at the end."""
    extra = []
    if args.wheels is not None:
        extra.append(str(install_wheels(args.wheels, work)))
    sys.path[:0] = [*extra, str(REPO)]
    try:
        import av  # noqa: F401  (the synthetic clips are written and decoded with PyAV)
        import transformers
    except ImportError as e:
        out["error"] = (f"{e}: PyAV (av) writes and decodes the synthetic clips; carry its wheel "
                        "(scripts/gpu_wheels.txt) and pass --wheels DIR")
        print(f"gpu_check: {out['error']}")
        write_out()
        return 3
    out["versions"]["transformers"] = transformers.__version__
    from easyvideor1.data.synth import SynthConfig, write_suite

    data = {}
    for name in names:  # one data set per workload (real, long, or their tiny versions)
        wl = workload(name, args.tiny)
        folder = work / f"data_{wl.clip_side}_{wl.clip_seconds}_{wl.prompts}_{len(wl.tasks)}"
        if not folder.is_dir():
            write_suite(folder, num_train=wl.prompts * args.steps, num_val=0, tasks=wl.tasks,
                        cfg=SynthConfig(size=wl.clip_side, cell=wl.clip_side // 2, fps=8, seconds=wl.clip_seconds))
        data[name] = {"train": str(folder / "train.jsonl")}
    (work / "data.json").write_text(json.dumps(data))
    out["workloads"] = {name: asdict(workload(name, args.tiny)) for name in names}
    out["workload"] = out["workloads"][names[0]]
    env = child_env(extra)
    for i, name in enumerate(names):
        left = args.deadline - (time.perf_counter() - started)
        if left < 30:
            out["models"].append({"model": name, "steps": [], "status": "skipped (deadline)"})
            continue
        print(f"gpu_check: {name} ({left:.0f} s left) ...", flush=True)
        result = run_child(name, args, work, env, timeout=left / (len(names) - i))
        out["models"].append(result)
        write_out()
        print(f"gpu_check: {name}: {result['status']} in {result['seconds']:.0f} s", flush=True)
        for line in result.get("log_tail", []):
            print(f"    {line}")
    out["seconds"] = time.perf_counter() - started
    write_out()
    print(table(out["models"]))
    if args.out is not None:
        print(f"gpu_check: wrote {args.out / 'gpu_check.json'}")
    return 0 if all(r.get("status") == "ok" for r in out["models"]) else 1


