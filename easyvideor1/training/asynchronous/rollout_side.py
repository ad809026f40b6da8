"""Separate rollout placement, the rollout side (`trainer_side` holds the trainer's).

It builds what the rollout stage needs (its own copy of the policy in the rollout dtype, the
engine, the prompt builder, the scorer, the loader at the trainer's position: `setup.make_rollouts`,
as colocated, so video tools run their multi-turn loop here), then for each
batch s: waits for the weights of `weight_version(s)` (`weights.WeightReceiver`; with partial
rollouts it also hands the engine the newer versions to switch to as it generates), runs the
trainer's own rollout stage (`trainer.rollout_stage`: prompts, generation, hybrid slot,
rewards beside generation, dynamic sampling rounds until the batch is full) as one process, and
sends each trainer rank its share (`shares.trainer_shares`; with ReMax's greedy baseline,
`greedy_shares`). It never updates the policy
and holds no optimizer. When the trainers hang up early (training.max_minutes) it ends quietly.

With `rollout.processes` N > 1 the N rollout processes are a pool (`join_pool`: a default process
group of their own): each runs that same stage as one process, only its generation split
(`sequence_parallel.split_rollouts`: this process generates its N-th of the responses, the pool
gathers them), so each holds the whole batch and takes every decision alike; process 0 sends it.
A vLLM engine takes the pool's group as its world (one engine per process, or per
`rollout.tensor_parallel_size` consecutive processes: `rollout.vllm_engine`).

Two launches:
- `python -m easyvideor1.training.asynchronous.rollout_side PORT PARENT_PID INDEX`, by the one-process
  trainer (`RemoteRollouts.spawn`), once per rollout process: it connects to the trainer's
  listener with the key in its environment. It dies with the trainer: the kernel sends it SIGKILL
  when its parent ends (`PR_SET_PDEATHSIG`, Linux), and a thread ends it when its parent pid
  changes (also when the trainer died while this module was still importing). Any error is sent
  to the trainer as text, then exit code 1.
- under torchrun, the last N ranks (`serve_rank`, from `easyvideor1 train`): each listens, puts
  its address and key in torchrun's store and takes one connection per trainer rank; torchrun
  ends them when a trainer dies. Any error is sent to every trainer rank as text, then raised
  (exit 1).
"""

from __future__ import annotations

import ctypes
import datetime
import logging
import os
import pickle
import secrets
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import torch
import torch.distributed as dist

from easyvideor1 import distributed, testhooks
from easyvideor1.config import Config
from easyvideor1.models.families import family_of
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.lora import apply_lora, has_adapters, trainable_names
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.ulysses import SequenceParallel
from easyvideor1.rollout.base import banned_token_ids
from easyvideor1.rollout.hf_engine import HFEngine, WeightSwitches
from easyvideor1.training.asynchronous.placement import (ADDRESS_KEY, KEY_ENV, PAIR_PREFIX, POOL_PREFIX,
                                                          pin_rank_devices, reachable_host, rollout_device,
                                                          rollout_dtype)
from easyvideor1.training.asynchronous.schedule import broadcast_versions, switch_versions, weight_version
from easyvideor1.training.asynchronous.shares import trainer_shares
from easyvideor1.training.asynchronous.weights import TrainersGone, WeightReceiver, weight_group
from easyvideor1.training.fsdp import untie_head
from easyvideor1.training.groups import ScoredGroups
from easyvideor1.training.loader import PromptLoader
from easyvideor1.training.metrics import StageTimer
from easyvideor1.training.run import Run
from easyvideor1.training.sequence_parallel import DataParallel, split_rollouts
from easyvideor1.training.sequences import ForwardContext
from easyvideor1.training.setup import load_split, make_rollouts, seed_everything
from easyvideor1.training.trainer import greedy_rewards, rollout_stage
from easyvideor1.vision.cache import FrameSource

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """End this process when the trainer (`parent`) ends, however it ends (kill -9 too)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):  # not Linux: the watcher below still ends it within a second
        pass
    if os.getppid() != parent:  # the trainer died before the kernel's watch was set
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)
    threading.Thread(target=watch, name="trainer-watch", daemon=True).start()


def send(conn: Connection, message: dict) -> None:
    """`message` to the trainer, pickled (tensors by value)."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


@dataclass(frozen=True)
class Pool:
    """This rollout process's place among the `rollout.processes` (`join_pool`)."""

    index: int
    size: int
    solo: Any = None  # a group of this process alone: reductions the pool must not repeat N times


def join_pool(store: dist.Store, index: int, size: int) -> Pool:
    """With more than one rollout process: the pool's default process group (gloo, on a prefix of
    `store`), in which the HF engine's lockstep decisions and dynamic sampling's stop decision are
    taken (`distributed.all_true`, ...), and which vLLM's engines take as their world. Every
    rollout process calls it (making groups is collective)."""
    if size == 1:
        return Pool(index, size)
    distributed.init_process_group(distributed.CPU_BACKEND, store=dist.PrefixStore(POOL_PREFIX, store), rank=index,
                                   world_size=size)
    solo = [dist.new_group([r], backend=distributed.CPU_BACKEND) for r in range(size)][index]
    return Pool(index, size, solo)


def build_rollout_run(cfg: Config, device: torch.device, pool: Pool) -> Run:
    """A `Run` holding only what `trainer.rollout_stage` reads (no optimizer, no reference). In a
    pool each process builds every prompt, generates its share of the responses and gathers the
    rest (`split_rollouts`); the prompt-failure and filter counts, already the batch's, are
    reduced over this process alone."""
    seed_everything(cfg.training.seed)
    samples = load_split(cfg.data.train_files, cfg)
    model = load_policy(cfg.model.path, rollout_dtype(cfg), cfg.model.attn_implementation, device=device)
    untie_head(model)  # as the trainer's policy: its own LM head arrives with each sync (and vLLM loads one)
    model.requires_grad_(False)
    family, spec, processor = family_of(model.config), mrope_spec(model.config), load_processor(cfg.model.path)
    ctx = ForwardContext(family=family, spec=spec, pad_token_id=processor.tokenizer.pad_token_id,
                         micro_batch_size=cfg.training.micro_batch_size, temperature=cfg.rollout.temperature,
                         device=device, banned_ids=tuple(banned_token_ids(processor.tokenizer)))
    frames = FrameSource(cfg.vision, cfg.data.cache_dir, cfg.data.cache_mode)
    lora = cfg.model.lora
    if lora.rank:  # the trainer's adapters, as built there: what each weight sync sends (`serve`)
        apply_lora(model, lora.rank, lora.scale_alpha, lora.dropout, lora.target_modules, lora.vision,
                   lora.modules_to_save)
        for name in trainable_names(model):  # peft makes them float32; they arrive in the rollout dtype
            param = model.get_parameter(name)
            param.data = param.data.to(rollout_dtype(cfg))
    split = None if pool.size == 1 else partial(split_rollouts, SequenceParallel(None, pool.index, pool.size))
    prompts, rollouts = make_rollouts(cfg, model, processor, family, spec, frames, samples, split=split,
                                      count_group=pool.solo)  # tools as colocated
    loader = PromptLoader(samples, cfg.training.rollout_batch_size, cfg.training.seed, cfg.data.shuffle)
    return Run(cfg=cfg, model=model, reference=None, optimizer=None, scheduler=None, kl=None, loader=loader,
               prompts=prompts, rollouts=rollouts, ctx=ctx, padding=prompts.empty(),
               data=DataParallel(0, 1, pool.solo))


def greedy_shares(run: Run, scored: ScoredGroups, shares: list[ScoredGroups], step: int) -> None:
    """ReMax: batch `step`'s greedy baseline (`trainer.greedy_rewards`), made with the weights that
    generated the batch (every pool process generates all of it); each of `shares` carries its
    prompts' rewards (`ScoredGroups.greedy`), so the trainer's advantages are colocated's."""
    rewards = dict(zip(map(id, scored.prompts), greedy_rewards(run, scored.prompts, step).tolist()))
    for share in shares:
        share.greedy = torch.tensor([rewards.get(id(p), 0.0) for p in share.prompts])  # [G]


def token_staleness(scored: ScoredGroups, step: int, version: int) -> tuple[float, float]:
    """Batch `step`'s staleness (mean, max) over its generated tokens: step - 1 - the version that
    sampled each (`Rollout.versions`; tool turns and offline trajectories have none), or that of
    `version`, the weights it began with, when no token records one (vLLM)."""
    ages = [step - 1 - v for group in scored.groups for r in group for v in r.versions or () if v >= 0]
    if not ages:
        return float(step - 1 - version), float(step - 1 - version)
    return sum(ages) / len(ages), float(max(ages))


def arrival_at(placed: str, switches: WeightSwitches, weights: WeightReceiver):
    """Test hook `partial.arrival` (`testhooks`): `switches.arrived` as if trainer rank 0's word came
    `decode=N` decode steps into the batch (waited for there) or `after` its generation."""
    at = float("inf") if placed == "after" else int(placed.removeprefix("decode="))

    def arrived(version: int) -> bool:
        if switches.steps < at:
            return False
        weights.announcement(version)
        return True
    return arrived


def serve(run: Run, store: dist.Store, start: int, loader_state: dict, trainers: list[Connection], pool: Pool) -> bool:
    """Generate and score batches start+1..steps, each with the weights the schedule names; each of
    `trainers` (a connection per trainer rank, in rank order) takes its share of each (sent by
    rollout process 0), then close the engine. Returns False early when a trainer hangs up."""
    cfg = run.cfg
    run.loader.load_state_dict(loader_state)
    named = dict(run.model.named_parameters())
    if has_adapters(run.model):  # LoRA: only what trains travels; the frozen base is the checkpoint's on both sides
        named = {n: named[n] for n in trainable_names(run.model)}
        log.info("LoRA: each weight sync sends the %d trained parameters (adapters, modules_to_save) only",
                 len(named))
    for conn in trainers:
        send(conn, {"kind": "hello", "names": list(named)})
    group = weight_group(store, 1 + pool.index, 1 + pool.size, run.ctx.device, cfg.training.collective_timeout_minutes)
    weights = WeightReceiver(group, [p.detach() for p in named.values()], rollout_dtype(cfg), trainers)
    hung_up = weights.hung_up
    engine = getattr(run.rollouts.engine, "engine", run.rollouts.engine)  # the token engine under the tool loop
    stamp = isinstance(engine, HFEngine)  # its tokens record the weights' version
    waits, held = [0.0], [start]  # this batch's waits for weights (the receives included); the version held

    def receive(version: int) -> None:  # after trainer rank 0's handshake, into the parameters, then the engine
        began = time.perf_counter()
        weights.receive(version)
        run.rollouts.engine.update_weights(run.model)
        if stamp:
            engine.version = version
        held[0] = version
        waits[0] += time.perf_counter() - began

    t, partial, every = cfg.training, cfg.rollout.partial, cfg.rollout.partial_tokens
    sent = broadcast_versions(start, t.steps, t.max_staleness, cfg.checkpoint.every, partial)  # what the trainer sends
    try:
        receive(start)
        for step in range(start + 1, t.steps + 1):
            need = weight_version(step, t.max_staleness, cfg.checkpoint.every, start)
            waits[0] = 0.0
            for later in [v for v in sent if held[0] < v <= need]:  # every version sent is received, in order
                receive(later)
            first = held[0]
            timer = StageTimer()
            batch = run.loader.peek_batch()  # the step's slots, which the trainer ranks' shares follow
            if partial:  # newer weights mid-generation: every `every` decode steps, or as each arrives (0)
                switches = WeightSwitches(every, switch_versions(step, first), receive, weights.arrived)
                if every == 0 and (placed := testhooks.action("partial.arrival")):
                    switches.arrived = arrival_at(placed, switches, weights)
                engine.switches = switches
            try:
                scored = rollout_stage(run, step, timer)
                if partial:  # the switches its generation ended before: counted ones now (reproducible), ones
                    engine.switches = None  # on arrival when arrived (or last); the rest at the next batch's start
                    for later in switches.versions:
                        if every == 0 and step < t.steps and not switches.arrived(later):
                            break
                        receive(later)
                # every pool process (rank balance may be a collective of the pool); process 0 sends
                shares = trainer_shares(scored, batch, len(trainers), cfg, run.padding)
                if cfg.algorithm.needs_greedy_rollout:  # ReMax: the baseline travels with the batch
                    with timer("greedy_rollout"):
                        greedy_shares(run, scored, shares, step)
            except RuntimeError:
                if pool.size > 1:  # a pool peer that ended: because the trainers hung up, or it failed
                    hung_up("the pool", within=5.0)
                raise
            if pool.index:
                continue
            message = {"kind": "batch", "step": step, "version": first, "loader": run.loader.state_dict(),
                       "staleness": token_staleness(scored, step, first), "train_wait": waits[0],
                       "metrics": {f"async/{k.removeprefix('time/')}_s": v for k, v in timer.times.items()}}
            for conn, share in zip(trainers, shares):
                send(conn, message | {"scored": share})
    except (TrainersGone, BrokenPipeError, ConnectionResetError):
        log.info("the trainers hung up (a run stopped early, or a trainer failed): stopping")
        return False
    # Before the pool's group is left: a vLLM engine's shutdown leaves its own groups and the
    # world (as the trainer's does when its run is freed); at exit, after them, it would fail.
    run.rollouts.engine.close()
    return True


def connect_and_serve(port: int, parent: int, index: int) -> None:
    """As rollout process `index`: connect to the trainer, take the run's config and build the
    rollout run (while the trainer builds its own), then take the start and serve its batches;
    errors go to it as text."""
    die_with_parent(parent)
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s rollout {index} %(name)s: %(message)s")
    conn = Client(("127.0.0.1", port), authkey=bytes.fromhex(os.environ.pop(KEY_ENV)))
    try:
        conn.send_bytes(pickle.dumps(index))  # the trainer orders the connections by it
        setup = pickle.loads(conn.recv_bytes())  # from the trainer that started this process
        cfg = setup["cfg"]
        store = dist.TCPStore("127.0.0.1", setup["port"], cfg.rollout.processes + 1, is_master=False,
                              timeout=datetime.timedelta(minutes=5))
        pool = join_pool(store, index, cfg.rollout.processes)
        run = build_rollout_run(cfg, rollout_device(cfg, index), pool)
        job = pickle.loads(conn.recv_bytes())  # once the trainer is built (and resumed): where to start
        finished = serve(run, dist.PrefixStore(PAIR_PREFIX, store), job["start"], job["loader"], [conn], pool)
    except BaseException:  # noqa: BLE001 - any failure goes to the trainer, which stops with it
        send(conn, {"kind": "error", "error": traceback.format_exc()})
        conn.close()
        sys.exit(1)
    conn.close()
    leave_pool(pool, finished)


def leave_pool(pool: Pool, finished: bool) -> None:
    """Leave the pool's group: with a barrier when every process served to the end
    (`distributed.close`); after the trainers hung up a peer may be gone, so end here, at once."""
    if pool.size == 1:
        return
    if not finished:
        logging.shutdown()
        os._exit(0)
    distributed.close()


def serve_rank(cfg: Config) -> None:
    """Under torchrun, as a rollout rank (`placement.is_rollout_rank`): build the rollout run,
    publish a listener in torchrun's store, take every trainer rank's connection, serve."""
    pin_rank_devices(cfg)  # first: before anything initialises CUDA
    rank, world = distributed.launched()
    trainers_world = world - cfg.rollout.processes
    store, key = distributed.launch_store(), secrets.token_bytes(32)
    pool = join_pool(store, rank - trainers_world, cfg.rollout.processes)
    run = build_rollout_run(cfg, rollout_device(cfg, pool.index), pool)
    with Listener((reachable_host(), 0), authkey=key) as listener:
        store.set(f"{ADDRESS_KEY}/{pool.index}", pickle.dumps((*listener.address, key)))
        conns = [listener.accept() for _ in range(trainers_world)]
    jobs = [pickle.loads(conn.recv_bytes()) for conn in conns]
    order = sorted(range(len(conns)), key=lambda i: jobs[i]["rank"])
    trainers, job = [conns[i] for i in order], jobs[order[0]]
    log.info("rollout rank %d: serving %d trainer rank(s) from step %d", rank, len(trainers), job["start"])
    try:
        finished = serve(run, dist.PrefixStore(PAIR_PREFIX, store), job["start"], job["loader"], trainers, pool)
    except BaseException:
        error = traceback.format_exc()
        for conn in trainers:
            try:
                send(conn, {"kind": "error", "error": error})
            except OSError:  # that trainer is gone already
                pass
        raise
    for conn in trainers:
        conn.close()
    if not finished:  # else `cli.main` leaves the pool's group (`distributed.close`)
        leave_pool(pool, finished=False)


if __name__ == "__main__":
    connect_and_serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
