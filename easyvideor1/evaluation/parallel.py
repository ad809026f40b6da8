"""Data parallel evaluation on one node: `eval --data-parallel N`.

    parent: plan (stores, settings check, pending items longest first)
            -> deal the items into N shares of nearly equal video seconds (longest first)
            -> N worker processes, each `python -m easyvideor1.evaluation.parallel JOB`
               with its own GPUs (CUDA_VISIBLE_DEVICES: tensor_parallel_size GPUs each)
            <- rows streamed back on the workers' stdout, appended to the ONE results store
               per benchmark as they arrive

Resume and the settings hash work as for one engine: the parent checks settings.json and
skips written ids before dealing, and a killed run leaves only whole rows. A worker holds an
`Evaluator` (its own engine) and runs exactly the (benchmark, sample id) pairs it was dealt,
in the given order. Across machines, use `eval --shard i/N` and merge with `easyvideor1 report`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from easyvideor1.cli import leave_process_groups
from easyvideor1.errors import UserError
from easyvideor1.evaluation.adapters import get_benchmark
from easyvideor1.evaluation.evaluator import EvalOptions, Evaluator, eval_settings, finish, plan, results_lock
from easyvideor1.evaluation.pipeline import Item, split_longest_first
from easyvideor1.evaluation.presets import Overrides
from easyvideor1.evaluation.results import ResultRow
from easyvideor1.vision.decode import probe_seconds

log = logging.getLogger(__name__)

ROW_PREFIX = "EASYVIDEOR1-ROW "  # marks result lines on a worker's stdout (anything else is passed on)


class WorkerFailed(UserError, RuntimeError):
    """A data-parallel worker exited with an error; the rows it wrote are kept."""


def visible_devices() -> list[str]:
    """The GPU ids this process may use (CUDA_VISIBLE_DEVICES, else every GPU torch sees)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d for d in env.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def device_groups(n: int, per_worker: int, devices: list[str]) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each of `n` workers (None: no GPU here, leave it unset)."""
    if not devices:
        return [None] * n
    if n * per_worker > len(devices):
        raise UserError(f"--data-parallel {n} x --tensor-parallel-size {per_worker} needs {n * per_worker} GPUs; "
                        f"{len(devices)} visible ({','.join(devices)})")
    return [",".join(devices[k * per_worker:(k + 1) * per_worker]) for k in range(n)]


def run_data_parallel(model_path: str, engine: str, preset: str, o: EvalOptions, benchmarks: list[str],
                      overrides: Overrides | None = None) -> dict[str, Any]:
    """Evaluate `benchmarks` with `o.data_parallel` engines (see the module docstring)."""
    with results_lock(o.out_dir):
        return _run_workers(model_path, engine, preset, o, benchmarks, overrides)


def _run_workers(model_path: str, engine: str, preset: str, o: EvalOptions, benchmarks: list[str],
                 overrides: Overrides | None) -> dict[str, Any]:
    n = o.data_parallel
    settings = eval_settings(model_path, engine, preset, o, overrides=overrides)
    benches, stores, items = plan(benchmarks, settings, o)
    shares = [s for s in split_longest_first(items, n, lru_cache(maxsize=None)(probe_seconds)) if s]
    groups = device_groups(len(shares), o.tensor_parallel_size if engine == "vllm" else 1, visible_devices())
    lock = threading.Lock()
    written = [0] * len(shares)
    from tqdm import tqdm

    progress = tqdm(total=len(items), desc=f"eval x{len(shares)}", unit="sample", dynamic_ncols=True)

    def pump(k: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            at = line.find(ROW_PREFIX)  # a library's unterminated print may precede the marker
            if at < 0:
                sys.stderr.write(f"[worker {k}] {line}")
                continue
            if at:
                sys.stderr.write(f"[worker {k}] {line[:at]}\n")
            msg = json.loads(line[at + len(ROW_PREFIX):])
            with lock:
                stores[msg["benchmark"]].append(ResultRow.from_dict(msg["row"]))
                written[k] += 1
                progress.update(1)

    procs, threads = [], []
    with tempfile.TemporaryDirectory(prefix="easyvideor1-dp-") as tmp:
        for k, (share, devices) in enumerate(zip(shares, groups)):
            job = Path(tmp) / f"job{k}.json"
            job.write_text(json.dumps({
                "model": model_path, "engine": engine, "preset": preset,
                "options": {**dataclasses.asdict(o), "data_parallel": 1, "shard": None},
                "overrides": dataclasses.asdict(overrides or Overrides()), "benchmarks": benchmarks,
                "items": [[it.key, it.sample.problem_id] for it in share]}))
            env = dict(os.environ)
            if devices is not None:
                env["CUDA_VISIBLE_DEVICES"] = devices
            proc = subprocess.Popen([sys.executable, "-m", "easyvideor1.evaluation.parallel", str(job)], env=env,
                                    stdout=subprocess.PIPE, text=True, bufsize=1)
            procs.append(proc)
            threads.append(threading.Thread(target=pump, args=(k, proc), daemon=True))
            threads[-1].start()
            log.info("worker %d: %d samples on %s", k, len(share), f"GPUs {devices}" if devices else "CPU")
        codes = [p.wait() for p in procs]
        for t in threads:
            t.join()
    progress.close()
    for store in stores.values():
        store.close()
    bad = [(k, c) for k, c in enumerate(codes) if c != 0 or written[k] != len(shares[k])]
    if bad:
        detail = ", ".join(f"worker {k} exited {c} after {written[k]} of {len(shares[k])} rows" for k, c in bad)
        raise WorkerFailed(f"data-parallel evaluation incomplete: {detail} (its log is above). The rows written "
                           f"are kept in {o.out_dir}; run the same command again to finish the rest.")
    return finish(o.out_dir, benches)


def worker(job_path: str) -> int:
    """One data-parallel worker: evaluate the dealt items, print each row on stdout."""
    job = json.loads(Path(job_path).read_text())
    o = EvalOptions(**job["options"])
    evaluator = Evaluator(job["model"], engine=job["engine"], preset=job["preset"], options=o,
                          overrides=Overrides(**job["overrides"]))
    benches = {b.name: b for b in (get_benchmark(spec) for spec in job["benchmarks"])}
    wanted = {(b, i) for b, i in job["items"]}
    samples = {(name, s.problem_id): s for name, bench in benches.items()
               for s in bench.load(o.data_root) if (name, s.problem_id) in wanted}
    items = [Item(key=b, sample=samples[(b, i)]) for b, i in job["items"]]
    lock = threading.Lock()

    def emit(benchmark: str, row: ResultRow) -> None:
        line = ROW_PREFIX + json.dumps({"benchmark": benchmark, "row": json.loads(row.to_json())}) + "\n"
        with lock:
            sys.stdout.write(line)
            sys.stdout.flush()

    evaluator.execute(benches, items, emit)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    code = worker(sys.argv[1])
    leave_process_groups()  # a no-op unless the engine joined a group of this package's
    sys.exit(code)
