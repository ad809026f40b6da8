"""Separate placement, the trainer's side: start (or, under torchrun, find) the rollout
processes, send them weights, take their scored batches (`rollout_side` is theirs)."""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import queue
import secrets
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import torch
import torch.distributed as dist

from easyvideor1 import distributed
from easyvideor1.config import Config
from easyvideor1.training.asynchronous.placement import (ADDRESS_KEY, KEY_ENV, PAIR_PREFIX, engine_width,
                                                          rollout_dtype, rollout_env, rollout_ranks)
from easyvideor1.training.asynchronous.schedule import broadcast_versions
from easyvideor1.training.asynchronous.weights import POLL_S, Window, bucket_layout, pack_bucket, weight_group

log = logging.getLogger(__name__)


@dataclass
class AsyncStats:
    """What one batch's trip adds to the step's metrics."""

    staleness_mean: float = 0.0  # over the batch's generated tokens: step - 1 - the version that sampled it
    staleness_max: float = 0.0
    train_wait: float = 0.0  # the rollout process idle, waiting for weights, before this batch
    extra: dict[str, float] = field(default_factory=dict)


class RemoteRollouts:
    """The trainer's handle on its rollout processes: start them, send weights, take batches
    (from rollout process 0; the others only generate)."""

    def __init__(self, cfg: Config, device: torch.device):
        self.cfg, self.device = cfg, device
        self.processes: list[subprocess.Popen] = []
        self.pending: list[int] = []  # versions still to broadcast, in order
        self.group: Any = None  # the weight group (trainer rank 0 only)
        # the syncs since the last batch taken (reported with it): the wait for the rollout
        # processes to be ready, and the gathers and broadcasts
        self.sync_times: dict[str, float] = {}

    def spawn(self) -> None:
        """Start the rollout processes and hand each the run's config as it connects (a thread), so
        their imports and model load run while the trainer loads its own (`setup.build_run`)."""
        n = self.cfg.rollout.processes
        self.threads = max(1, torch.get_num_threads() // (n + 1))  # the cores split between trainer and rollout
        self.store = dist.TCPStore("127.0.0.1", 0, n + 1, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(minutes=5))
        key = secrets.token_bytes(32)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), KEY_ENV: key.hex()}
        envs = [rollout_env(env, i, n, engine_width(self.cfg)) for i in range(n)]  # a ConfigError before any starts
        for i in range(n):
            self.processes.append(subprocess.Popen([sys.executable, "-m", "easyvideor1.training.asynchronous.rollout_side",
                                                    str(listener.address[1]), str(os.getpid()), str(i)], env=envs[i]))
            log.info("%s started", self.peer(i))
        setup = pickle.dumps({"cfg": self.cfg, "port": self.store.port})
        self.accepted: list[Connection] = []
        self.acceptor = threading.Thread(target=self._accept, args=(listener, n, setup), name="rollout-accept",
                                         daemon=True)
        self.acceptor.start()

    def start(self, model: torch.nn.Module, start: int, loader_state: dict[str, Any]) -> None:
        """Batches start+1..steps: the rollout processes (started by `spawn`) take `start` and the
        loader's state, then the weights of `start`."""
        t, n = self.cfg.training, self.cfg.rollout.processes
        if not self.processes:
            self.spawn()
        self.pending = broadcast_versions(start, t.steps, t.max_staleness, self.cfg.checkpoint.every,
                                          self.cfg.rollout.partial)
        self.restore = torch.get_num_threads()  # back after training (validation, export)
        torch.set_num_threads(self.threads)
        log.info("separate placement: %d rollout process(es), max_staleness %d, %d thread(s) each", n,
                 t.max_staleness, self.threads)
        while self.acceptor.is_alive():
            self.alive("their connections")
            self.acceptor.join(POLL_S)
        if len(self.accepted) != n:
            raise RuntimeError("the rollout processes did not connect to the trainer")
        self._join(model, self.accepted, {"start": start, "loader": loader_state},
                   dist.PrefixStore(PAIR_PREFIX, self.store))

    def peer(self, i: int) -> str:
        """Rollout process i, as messages name it."""
        pid = self.processes[i].pid
        if self.cfg.rollout.processes == 1:
            return f"the rollout process (pid {pid})"
        return f"rollout process {i} (pid {pid})"

    def _join(self, model: torch.nn.Module, conns: list[Connection], job: dict[str, Any],
              pair: dist.Store | None) -> None:
        """Over `conns` (rollout process i's at i): hand each `job`, take the parameter names once
        their models are built, join the weight group on `pair` (None: a trainer rank that does not
        broadcast), send the first weights."""
        self.conns = conns
        self.inbox: queue.Queue[tuple[int, bytes | None]] = queue.Queue()  # (rollout process, message)
        self.stash: list[list[dict[str, Any]]] = [[] for _ in conns]  # messages taken while waiting for another
        self.readers = [threading.Thread(target=self._read, args=(i,), name=f"rollout-inbox-{i}", daemon=True)
                        for i in range(len(conns))]
        for reader in self.readers:
            reader.start()
        data = pickle.dumps(job)
        for conn in conns:
            conn.send_bytes(data)
        names = [self._message("hello", i)["names"] for i in range(len(conns))]  # built: join the weight group
        self.group = None if pair is None else weight_group(pair, 0, len(conns) + 1, self.device,
                                                            self.cfg.training.collective_timeout_minutes)
        self.params = dict(model.named_parameters())
        missing = [n for n in names[0] if n not in self.params]
        if missing or any(other != names[0] for other in names):
            raise RuntimeError(f"{self.peer(0)}'s model has parameters the policy lacks: {missing[:5]}" if missing
                               else "the rollout processes built models with different parameters")
        self.names = names[0]
        self.layout = bucket_layout([self.params[n].shape for n in self.names], rollout_dtype(self.cfg))
        self._send(job["start"])

    def _accept(self, listener: Listener, n: int, setup: bytes) -> None:
        """Thread: the rollout processes' connections (authenticated by the key they were given),
        each handed `setup` at once, into `accepted` in the order of their index (each sends it first)."""
        got: list[tuple[int, Connection]] = []
        with listener:
            for _ in range(n):
                conn = listener.accept()
                got.append((pickle.loads(conn.recv_bytes()), conn))
                conn.send_bytes(setup)
        self.accepted = [conn for _, conn in sorted(got, key=lambda x: x[0])]

    def alive(self, what: str) -> None:
        """Raise, naming every rollout process that is gone and its exit code."""
        dead = [i for i, p in enumerate(self.processes) if p.poll() is not None]
        if dead:
            raise RuntimeError("; ".join(f"{self.peer(i)} died with exit code {self.processes[i].returncode}"
                                         for i in dead) + f" while the trainer waited for {what}; see its log above")

    def _read(self, i: int) -> None:
        """Reader thread i: every message of rollout process i into `inbox` as it comes (None at the
        end), so a rollout process never blocks on a full socket while the trainer waits in a broadcast."""
        try:
            while True:
                self.inbox.put((i, self.conns[i].recv_bytes()))
        except (EOFError, OSError):
            self.inbox.put((i, None))

    def _message(self, kind: str, source: int = 0) -> dict[str, Any]:
        """The next `kind` message from rollout process `source` (polling every process's liveness;
        messages of other kinds wait in `stash`); an error from any of them re-raised, naming it
        (after the liveness check: a peer that died first is the cause)."""
        while not any(m["kind"] == kind for m in self.stash[source]):
            try:
                i, data = self.inbox.get(timeout=POLL_S)
            except queue.Empty:
                self.alive(f"a message ({kind})")
                continue
            if data is None:  # that connection ended; only the awaited one's end is news
                if i == source:
                    self._ended(kind, i)
                continue
            msg = pickle.loads(data)  # from our own rollout side, over an authenticated connection
            if msg["kind"] == "error":
                self.alive(f"a message ({kind})")
                raise RuntimeError(f"{self.peer(i)} failed:\n{msg['error']}")
            self.stash[i].append(msg)
        return self.stash[source].pop([m["kind"] for m in self.stash[source]].index(kind))

    def _ended(self, kind: str, i: int) -> None:
        """Connection i ended: its process ends too; its exit code is the message."""
        self.processes[i].wait(timeout=60)
        self.alive(f"a message ({kind})")
        raise RuntimeError(f"{self.peer(i)} closed its connection before sending a {kind} message")

    def _send(self, version: int) -> None:
        """The weights after step `version`: every parameter in `names` order, cast to the rollout
        dtype where it lies (under FSDP2 the local shard: the gather moves rollout-dtype bytes), made
        whole (FSDP2's `full_tensor`, a collective of every trainer rank, all in this order), one
        flat bucket per broadcast (`weights.bucket_layout`). Trainer rank 0 first says "weights" to
        each rollout process and takes its "ready", so neither side enqueues a broadcast while the
        other is still busy (an NCCL wait would count against its timeout); it broadcasts each
        bucket as it is gathered (`weights.Window`)."""
        dtype, window = rollout_dtype(self.cfg), None
        began = ready = time.perf_counter()
        if self.group is not None:
            for conn in self.conns:  # first: a partial rollout switches as it arrives (`hf_engine.WeightSwitches`)
                conn.send_bytes(pickle.dumps({"kind": "weights", "version": version}))
            for i in range(len(self.conns)):
                self._message("ready", i)
            ready = time.perf_counter()
            window = Window(self.group, self.alive, "the weight broadcast")
        for bucket in self.layout:
            parts = []
            for i in bucket:
                p = self.params[self.names[i]].detach().to(dtype)
                p = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2: the whole parameter
                parts.append(p.to(self.device))
            if window is not None:
                window.add(pack_bucket(parts))
        if window is not None:
            window.finish()
        for key, seconds in (("async/ready_wait_s", ready - began), ("async/sync_s", time.perf_counter() - ready)):
            self.sync_times[key] = self.sync_times.get(key, 0.0) + seconds

    def take(self, step: int) -> tuple[Any, dict[str, Any], AsyncStats]:
        """Batch `step`'s scored groups, the loader state after it, and its trip's numbers."""
        msg = self._message("batch")
        if msg["step"] != step:
            raise RuntimeError(f"the rollout process sent batch {msg['step']}, the trainer expected {step}")
        stats = AsyncStats(*msg["staleness"], train_wait=msg["train_wait"], extra=msg["metrics"] | self.sync_times)
        self.sync_times = {}
        return msg["scored"], msg["loader"], stats

    def publish(self, step: int) -> bool:
        """After step `step`: broadcast its weights (the policy's parameters, taken at `start`)
        when a later batch is generated with them."""
        if not self.pending or self.pending[0] != step:
            return False
        self.pending.pop(0)
        self._send(step)
        return True

    def close(self) -> None:
        """Wait briefly for the rollout processes to end, else end them (a run stopped early)."""
        processes, self.processes = self.processes, []
        if not processes:
            return
        torch.set_num_threads(self.restore)
        for p in processes:
            try:
                p.wait(timeout=10 if not self.pending else 0.1)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for conn in self.conns:
            conn.close()


class RankRollouts(RemoteRollouts):
    """Under torchrun: a trainer rank's handle on the rollout ranks (the last ranks, started by
    torchrun, not by the trainer): its share of each batch (from the first rollout rank), and the
    weights (every trainer rank gathers them, trainer rank 0 sends)."""

    def __init__(self, cfg: Config, device: torch.device, rank: int):
        super().__init__(cfg, device)
        self.rank, self.store = rank, distributed.launch_store()
        self.first = distributed.launched()[1] - cfg.rollout.processes  # the first rollout rank

    def peer(self, i: int) -> str:
        return f"the rollout rank {self.first + i}"

    def alive(self, what: str) -> None:
        """torchrun watches the rollout ranks (and ends this rank when one dies)."""

    def start(self, model: torch.nn.Module, start: int, loader_state: dict[str, Any]) -> None:
        """Connect to each rollout rank (its address in torchrun's store once its model is built),
        hand it this rank's start, take part in sending the weights of `start`."""
        t, n = self.cfg.training, self.cfg.rollout.processes
        self.pending = broadcast_versions(start, t.steps, t.max_staleness, self.cfg.checkpoint.every,
                                          self.cfg.rollout.partial)
        conns = []
        for i in range(n):
            host, port, key = pickle.loads(self.store.get(f"{ADDRESS_KEY}/{i}"))
            log.info("trainer rank %d: %s at %s:%d (separate placement, max_staleness %d)", self.rank, self.peer(i),
                     host, port, t.max_staleness)
            conns.append(Client((host, port), authkey=key))
        job = {"rank": self.rank, "start": start, "loader": loader_state}
        self._join(model, conns, job, dist.PrefixStore(PAIR_PREFIX, self.store) if self.rank == 0 else None)

    def _ended(self, kind: str, i: int) -> None:
        raise RuntimeError(f"{self.peer(i)} closed its connection while trainer rank {self.rank} waited for a {kind} "
                           "message: it ended (torchrun's summary gives its exit code)")

    def close(self) -> None:
        """Hang up: rollout ranks with batches left end quietly (`rollout_side.serve`). Each socket
        is shut down first, so its reader thread ends on end-of-file, not on a closed handle."""
        for conn in self.conns:
            with socket.socket(fileno=os.dup(conn.fileno())) as s:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:  # the rollout rank hung up first
                    pass
        for reader in self.readers:
            reader.join()
        for conn in self.conns:
            conn.close()


def remote_rollouts(cfg: Config, device: torch.device, rank: int) -> RemoteRollouts | None:
    """The trainer's handle on its rollout side under separate placement (None: colocated). In one
    process its rollout processes start now (`RemoteRollouts.spawn`): make it before loading the policy."""
    if cfg.rollout.placement != "separate":
        return None
    if rollout_ranks(cfg):
        return RankRollouts(cfg, device, rank)
    remote = RemoteRollouts(cfg, device)
    remote.spawn()
    return remote
