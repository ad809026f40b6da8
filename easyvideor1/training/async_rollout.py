"""Separate rollout placement, the trainer's side: a rollout process generates and scores
while the trainer updates (`rollout.placement=separate`, `training.max_staleness=k`).

    trainer: ... update s -> broadcast weights v=s (when a later batch needs them) -> take batch s+1
    rollout: wait for version(s) -> generate + score batch s -> send it to the trainer -> next s

The schedule fixes which weights generate which batch, never the timing:
batch s is generated with the weights after step `weight_version(s)` = s - 1 - k, but never
older than the last checkpoint step before s (nor the step a run resumed from). So both sides
know in advance which versions travel, a run is reproducible, and a checkpoint holds nothing
in flight: a resumed run equals an uninterrupted one. k = 0 is on-policy (the same batches as
`colocated`); k = 1 overlaps generation of batch s+1 with the update of step s. Each checkpoint
step costs one on-policy batch (a pipeline bubble).

The loss with k > 0 is decoupled PPO (AReaL, Fu et al. 2025; verl's rollout correction in
decoupled mode, `decoupled_token_is`), with no code of its own: the clip ratio is taken against
the proximal policy, the trainer's log-probs at its current weights before the update
(`old_log_probs`: the old-log-prob pass, or the first forward detached when one update covers
the batch), and the behaviour correction of `algorithms.rollout_correction` against the
rollout weights' log-probs (`behaviour_log_probs`), `token_tis` by default:

    L = -sum_t w_t * min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)
    r_t = pi_theta(y_t) / pi_prox(y_t),    w_t = min(pi_prox(y_t) / pi_behav(y_t), C)  (detached)

Transport. Weights: a collective broadcast, parameter by parameter in the rollout dtype, over a
process group of their own (trainer rank 0 as rank 0, rollout process i as rank 1 + i: every
rollout process receives every sync; gloo on CPU, NCCL on GPU; not the trainers' world, whose
collectives it must not join), never through disk. Scored batches: pickled `ScoredGroups`
(tensors by value) over authenticated connections (`multiprocessing.connection`, a random key).

`rollout.processes` N > 1: the rollout processes are a pool (a default process group of their
own, gloo, on another prefix of the store) that runs the rollout stage as ONE process would, its
generation split as a sequence-parallel group splits it (`sequence_parallel.split_rollouts`):
each process builds every prompt of the step, generates its contiguous N-th of the responses
(each with the seed it has in one process) and the pieces are gathered, so every process holds
the whole batch, scores it and takes the same dynamic-sampling and hybrid decisions (the same
collectives on each). The batch is therefore that of N = 1 for the same seed; rollout process 0
sends the trainer ranks their shares, the others only generate. Prompts are built and responses
scored on every rollout process (a reward-model judge is called N times). With vLLM each rollout
process runs an engine in process under vLLM's `external_launcher` with the pool's group as its
world (`rollout.vllm_engine`): `rollout.tensor_parallel_size` k, which must divide N, makes k
consecutive processes one engine that exchanges their shares; each process loads every sync into
its engine. The batch is again that of N = 1 up to vLLM's float sums in other batches (measured:
equal bit for bit with k = 1, parameters 5e-6 apart with k = 2).

Two launches. `easyvideor1 train` in one process starts its N rollout processes itself,
subprocesses running the package (`python -m easyvideor1.training.rollout_process`, the key in
their environment) that connect back to the trainer; each connection carries the run's config,
and process 0's then each scored batch (`RemoteRollouts`). Under torchrun the last
`rollout.processes` ranks are the rollout ranks (`is_rollout_rank`): every rank takes torchrun's
store, the trainer ranks (0..W-N-1) make the default process group on a prefix of it with world
W-N (so FSDP, checkpoints, rank balance and metrics see trainers only), the rollout ranks never
join it. Each rollout rank publishes its listener's address and key in the store; every trainer
rank connects to each and takes its share of each batch from rollout rank W-N (`trainer_shares`:
the slots a colocated run of the trainer ranks gives each); every trainer rank gathers each full
parameter (FSDP2's `full_tensor`, a collective of the trainers) in the same order and trainer
rank 0 broadcasts it over the weight group, made on another prefix of the store (`RankRollouts`).

Faults: every wait (a broadcast, a batch) polls the rollout processes, so one that dies stops the
trainer within seconds, naming it and its exit code (the first to die: a pool peer that fails
after it, on gloo's "connection closed", is named too); rollout processes kill themselves when
the trainer dies (`rollout_process.die_with_parent`). Under torchrun, torchrun ends every rank
when one dies and names its rank and exit code (a trainer rank waiting for a batch stops first,
naming the rollout rank and its error when it sent one; one inside the weight broadcast with
gloo's "connection closed by peer"). A rollout side whose trainers hang up (a run stopped early)
ends quietly. Validation runs in the trainer, on an HF engine over the policy (whatever
`rollout.engine` the rollout side uses). Not yet: LoRA, ReMax's greedy baseline, video tools,
sequence parallelism with rollout ranks, a vLLM tensor-parallel size that does not divide N.
"""

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
from easyvideor1.config_tree import ConfigError
from easyvideor1.distributed import serial_gloo_group
from easyvideor1.models.loading import resolve_dtype
from easyvideor1.prompts import Prompt
from easyvideor1.records import Sample
from easyvideor1.training.groups import ScoredGroups, pad_groups
from easyvideor1.training.hybrid import HybridCounters
from easyvideor1.training.rank_balance import rank_slots

log = logging.getLogger(__name__)

KEY_ENV = "EASYVIDEOR1_ROLLOUT_KEY"  # the connection's key (hex), handed to the rollout process
POLL_S = 0.05  # how often a wait looks at the other process
SEND_WINDOW_BYTES = 512 * 2**20  # weight broadcasts in flight at once (the sender's extra memory)
PAIR_PREFIX = "rollout-pair/"  # the weight group's keys in the store (torchrun's, or the trainer's)
POOL_PREFIX = "rollout-pool/"  # rollout.processes > 1: the rollout processes' own default group
ADDRESS_KEY = "rollout-address"  # under torchrun: + "/i", (host, port, key) of rollout rank i's listener


def weight_version(step: int, k: int, every: int, start: int = 0) -> int:
    """The weights (after which step) batch `step` is generated with: step - 1 - k, but never
    older than the last checkpoint step before `step` (`every` = checkpoint.every) nor `start`."""
    last_checkpoint = (step - 1) // every * every if every else 0
    return max(step - 1 - k, last_checkpoint, start)


def broadcast_versions(start: int, steps: int, k: int, every: int) -> list[int]:
    """The versions sent after the initial one (`start`), in order: each needed by some batch."""
    return sorted({weight_version(s, k, every, start) for s in range(start + 1, steps + 1)} - {start})


def rollout_dtype(cfg: Config) -> torch.dtype:
    """What the rollout process holds its weights in: vLLM's `rollout.dtype`, else the compute dtype."""
    return resolve_dtype(cfg.rollout.dtype if cfg.rollout.engine == "vllm" else cfg.model.dtype)


def check_placement(cfg: Config, world: int) -> None:
    """`training.max_staleness` needs separate placement; what that does not run yet, one clear
    error each. `world`: the processes torchrun launched (1 without it), rollout ranks included."""
    r = cfg.rollout
    if r.placement != "separate":
        if cfg.training.max_staleness:
            raise ConfigError(f"training.max_staleness={cfg.training.max_staleness} needs rollout.placement=separate "
                              "(colocated generation is always on-policy)")
        return
    if r.processes < 1:
        raise ConfigError(f"rollout.processes={r.processes} must be >= 1")
    if world > 1 and r.processes >= world:
        raise ConfigError(f"rollout.processes={r.processes} under torchrun with {world} processes leaves no trainer "
                          f"rank: launch more than {r.processes} processes")
    if r.engine == "vllm" and r.processes % r.tensor_parallel_size:
        raise ConfigError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} must divide rollout.processes="
                          f"{r.processes} under separate placement (each rollout process is one rank of a vLLM engine)")
    if world > 1 and cfg.training.sequence_parallel_size > 1:
        raise ConfigError("rollout.placement=separate under torchrun with training.sequence_parallel_size > 1 is "
                          "not supported yet")
    if cfg.model.lora.rank:
        raise ConfigError("rollout.placement=separate with LoRA (model.lora.rank) is not supported yet")
    if r.tools:
        raise ConfigError("rollout.placement=separate with video tools (rollout.tools) is not supported yet")
    if cfg.algorithm.needs_greedy_rollout:
        raise ConfigError("rollout.placement=separate with a greedy baseline (ReMax) is not supported yet")
    if cfg.training.max_staleness < 0:
        raise ConfigError(f"training.max_staleness={cfg.training.max_staleness} must be >= 0")


def rollout_ranks(cfg: Config) -> int:
    """How many of torchrun's processes (the last ones) are rollout ranks: `rollout.processes`
    under separate placement when torchrun launched more than one, else 0 (one process starts
    its rollout processes itself)."""
    world = distributed.launched()[1]
    return cfg.rollout.processes if cfg.rollout.placement == "separate" and world > 1 else 0


def is_rollout_rank(cfg: Config) -> bool:
    """This process is one of the last `rollout.processes` ranks of torchrun's world: it only
    generates and scores (`rollout_process.serve_rank`). Checks the placement first (every rank alike)."""
    rank, world = distributed.launched()
    check_placement(cfg, world)
    return rank >= world - rollout_ranks(cfg)


def reachable_host() -> str:
    """This machine's address on the route to torchrun's MASTER_ADDR (127.0.0.1 on one node):
    where trainer ranks on other nodes reach the rollout rank's listener. (A UDP connect sends nothing.)"""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, 1))
        return s.getsockname()[0]


def trainer_shares(scored: ScoredGroups, batch: list[Sample], trainers: int, cfg: Config,
                   padding: Prompt) -> list[ScoredGroups]:
    """Each trainer rank's part of a step's global `scored` groups (made by the rollout side as one
    process: slot order). Without dynamic sampling rank r gets the slots a colocated run of
    `trainers` ranks gives it (`rank_slots` of the step's `batch`; a group's slot is its prompt's
    `seed_offset` / n), so the same prompts, responses and token balance; with dynamic sampling,
    which fills the batch as one colocated process does, equal contiguous parts. Each part is
    padded where samples failed. The hybrid counts (which ranks sum) go with the first part; the
    filter metrics, already the batch's, with every part."""
    if trainers == 1:
        return [scored]
    per, n = cfg.training.rollout_batch_size // trainers, cfg.rollout.n
    if cfg.algorithm.online_filtering:
        parts = [range(r * per, (r + 1) * per) for r in range(trainers)]
    else:
        group_of = {p.seed_offset // n: g for g, p in enumerate(scored.prompts) if not p.padding}
        vision = cfg.vision if cfg.training.balance_ranks else None
        parts = [[group_of[s] for s in rank_slots(batch, r, trainers, vision) if s in group_of]
                 for r in range(trainers)]
    return [pad_groups(ScoredGroups([scored.prompts[g] for g in part], [scored.groups[g] for g in part],
                                    [scored.results[g] for g in part],
                                    scored.hybrid if r == 0 else HybridCounters(), dict(scored.filter_metrics)),
                       per, padding, n)
            for r, part in enumerate(parts)]


def rollout_env(env: dict[str, str], index: int, processes: int) -> dict[str, str]:
    """The environment of spawned rollout process `index`: on GPUs, only its own device visible
    (the one after the trainer's, and the ones before it), so every engine it builds lands there:
    vLLM's one-process executor takes device 0 of what it sees, whatever `set_device` said. One
    GPU for the trainer and each rollout process, or a one-line error before anything starts."""
    if not torch.cuda.is_available():
        return env
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] or \
        [str(k) for k in range(torch.cuda.device_count())]
    if len(visible) < 1 + processes:
        raise ConfigError(f"rollout.placement=separate needs a GPU for the trainer and one for each of its "
                          f"{processes} rollout process(es), {1 + processes} in all; this process sees {len(visible)} "
                          "(two processes on one GPU cannot share NCCL's weight broadcasts): use "
                          "rollout.placement=colocated, or fewer rollout.processes")
    return {**env, "CUDA_VISIBLE_DEVICES": visible[1 + index]}


def weight_group(store: dist.Store, rank: int, size: int, device: torch.device, timeout_minutes: float) -> Any:
    """Trainer rank 0 (rank 0) and the `size` - 1 rollout processes (rank 1 + i): a process group
    of their own, for the weight broadcasts. A broadcast may wait `timeout_minutes`
    (`training.collective_timeout_minutes`; NCCL's default of 10 min would abort a long step)."""
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(store, rank, size, timeout)
    return serial_gloo_group(store, rank, size, timeout)  # one worker thread: distributed.py says why


def wait_work(work: Any, alive, what: str) -> None:
    """Wait for an async collective, checking `alive()` (raises with the peer's fate) meanwhile."""
    while not work.is_completed():
        alive(what)
        time.sleep(POLL_S)
    try:
        work.wait()
    except RuntimeError:
        alive(what)  # the peer died: its exit code says more than gloo's socket error
        raise


class WeightSender:
    """Broadcasts from rank 0 of the pair, tensor by tensor as they are handed over, with at most
    `SEND_WINDOW_BYTES` in flight: the sender never holds the whole model in the rollout dtype
    (under FSDP2 each whole parameter is gathered just before it is sent)."""

    def __init__(self, group: Any, alive):
        self.group, self.alive = group, alive
        self.works: list[tuple[Any, int]] = []  # (work, bytes) in flight, oldest first
        self.in_flight = 0

    def send(self, tensor: torch.Tensor) -> None:
        self.works.append((self.group.broadcast([tensor], dist.BroadcastOptions()), tensor.nbytes))
        self.in_flight += tensor.nbytes
        while self.in_flight > SEND_WINDOW_BYTES and len(self.works) > 1:
            self._wait_oldest()

    def finish(self) -> None:
        while self.works:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        work, nbytes = self.works.pop(0)
        wait_work(work, self.alive, "the weight broadcast")
        self.in_flight -= nbytes


@dataclass
class AsyncStats:
    """What one batch's trip adds to the step's metrics."""

    staleness: float = 0.0
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

    def start(self, model: torch.nn.Module, start: int, loader_state: dict[str, Any]) -> None:
        """Start the rollout processes for batches start+1..steps and send them the weights of `start`."""
        t, n = self.cfg.training, self.cfg.rollout.processes
        self.threads = torch.get_num_threads()  # back after training (validation, export)
        threads = max(1, self.threads // (n + 1))  # the cores split between the trainer and its rollout processes
        torch.set_num_threads(threads)
        self.pending = broadcast_versions(start, t.steps, t.max_staleness, self.cfg.checkpoint.every)
        self.store = dist.TCPStore("127.0.0.1", 0, n + 1, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(minutes=5))
        key = secrets.token_bytes(32)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), KEY_ENV: key.hex()}
        for i in range(n):
            self.processes.append(subprocess.Popen([sys.executable, "-m", "easyvideor1.training.rollout_process",
                                                    str(listener.address[1]), str(os.getpid()), str(i)],
                                                   env=rollout_env(env, i, n)))
            log.info("%s started", self.peer(i))
        log.info("separate placement: %d rollout process(es), max_staleness %d, %d thread(s) each", n,
                 t.max_staleness, threads)
        conns = self._accept(listener, n)
        job = {"cfg": self.cfg, "port": self.store.port, "start": start, "loader": loader_state}
        self._join(model, conns, job, dist.PrefixStore(PAIR_PREFIX, self.store))

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
        self._send()

    def _accept(self, listener: Listener, n: int) -> list[Connection]:
        """The rollout processes' connections (authenticated by the key they were given), polling
        them; in the order of their index (each sends it first)."""
        got: list[tuple[int, Connection]] = []

        def accept() -> None:
            for _ in range(n):
                conn = listener.accept()
                got.append((pickle.loads(conn.recv_bytes()), conn))
        waiter = threading.Thread(target=accept, daemon=True)
        waiter.start()
        while waiter.is_alive():
            self.alive("their connections")
            waiter.join(POLL_S)
        listener.close()
        if len(got) != n:
            raise RuntimeError("the rollout processes did not connect to the trainer")
        return [conn for _, conn in sorted(got, key=lambda x: x[0])]

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
        """The next message from rollout process `source` (polling every process's liveness); an
        error from any of them re-raised, naming it (after the liveness check: a peer that died
        first is the cause)."""
        while not self.stash[source]:
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
        msg = self.stash[source].pop(0)
        if msg["kind"] != kind:
            raise RuntimeError(f"expected a {kind} message from {self.peer(source)}, got {msg['kind']}")
        return msg

    def _ended(self, kind: str, i: int) -> None:
        """Connection i ended: its process ends too; its exit code is the message."""
        self.processes[i].wait(timeout=60)
        self.alive(f"a message ({kind})")
        raise RuntimeError(f"{self.peer(i)} closed its connection before sending a {kind} message")

    def _send(self) -> None:
        """Every parameter, whole, in `names` order (under FSDP2 a collective of every trainer rank);
        trainer rank 0 broadcasts each to every rollout process as it is gathered (`WeightSender`)."""
        dtype = rollout_dtype(self.cfg)
        sender = None if self.group is None else WeightSender(self.group, self.alive)
        for name in self.names:
            p = self.params[name].detach()
            p = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2: the whole parameter
            if sender is not None:
                sender.send(p.to(device=self.device, dtype=dtype).contiguous())
        if sender is not None:
            sender.finish()

    def take(self, step: int) -> tuple[Any, dict[str, Any], AsyncStats]:
        """Batch `step`'s scored groups, the loader state after it, and its trip's numbers."""
        msg = self._message("batch")
        if msg["step"] != step:
            raise RuntimeError(f"the rollout process sent batch {msg['step']}, the trainer expected {step}")
        stats = AsyncStats(staleness=float(step - 1 - msg["version"]), train_wait=msg["train_wait"],
                           extra=msg["metrics"])
        return msg["scored"], msg["loader"], stats

    def publish(self, step: int) -> bool:
        """After step `step`: broadcast its weights (the policy's parameters, taken at `start`)
        when a later batch is generated with them."""
        if not self.pending or self.pending[0] != step:
            return False
        self.pending.pop(0)
        self._send()
        return True

    def close(self) -> None:
        """Wait briefly for the rollout processes to end, else end them (a run stopped early)."""
        processes, self.processes = self.processes, []
        if not processes:
            return
        torch.set_num_threads(self.threads)
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
        self.pending = broadcast_versions(start, t.steps, t.max_staleness, self.cfg.checkpoint.every)
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
        """Hang up: rollout ranks with batches left end quietly (`rollout_process.serve`). Each socket
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
    """The trainer's handle on its rollout side under separate placement (None: colocated)."""
    if cfg.rollout.placement != "separate":
        return None
    return RankRollouts(cfg, device, rank) if rollout_ranks(cfg) else RemoteRollouts(cfg, device)
