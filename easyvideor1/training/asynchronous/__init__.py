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

Partial rollouts (`rollout.partial`, k >= 1, HF engine, one rollout process): batch s begins with
those weights and, as it generates, switches to each newer version up to the weights after step
s - 1 (`schedule.switch_versions`; the trainer then sends every step's weights): after every
`rollout.partial_tokens` decode steps (reproducible), or with 0 as each arrives (no waiting, timing
places the switches). The engine recomputes the unfinished rows' KV cache with the new weights
and every token records its version (`rollout.hf_engine.WeightSwitches`, `Rollout.versions`);
the correction below and the staleness metrics work per token. A checkpoint still holds nothing
in flight (the batch after a checkpoint step is on-policy, with nothing to switch to).

The loss with k > 0 is decoupled PPO (AReaL, Fu et al. 2025; verl's rollout correction in
decoupled mode, `decoupled_token_is`), with no code of its own: the clip ratio is taken against
the proximal policy, the trainer's log-probs at its current weights before the update
(`old_log_probs`: the old-log-prob pass, or the first forward detached when one update covers
the batch), and the behaviour correction of `algorithms.rollout_correction` against the
rollout weights' log-probs (`behaviour_log_probs`), `token_tis` by default:

    L = -sum_t w_t * min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)
    r_t = pi_theta(y_t) / pi_prox(y_t),    w_t = min(pi_prox(y_t) / pi_behav(y_t), C)  (detached)

Transport. Weights: collective broadcasts over a process group of their own (trainer rank 0 as
rank 0, rollout process i as rank 1 + i: every rollout process receives every sync; gloo on CPU,
NCCL on GPU; not the trainers' world, whose collectives it must not join), never through disk.
One broadcast per flat bucket of consecutive parameters (`weights.BUCKET_BYTES`, 4 MiB; a bigger
parameter alone), in the rollout dtype, which each parameter is cast to before it is gathered
(under FSDP2 the local shard: the all-gather moves rollout-dtype bytes); both sides compute the
layout from the parameter names' shapes (`weights.bucket_layout`). Each sync opens with a
handshake over the connections: trainer rank 0 says "weights" once it has the version, the
rollout process says "ready" when it needs it, and only after both do they post broadcasts, so
neither waits in one (NCCL's watchdog) through the other's step or generation. Scored batches: pickled `ScoredGroups`
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
subprocesses running the package (`python -m easyvideor1.training.asynchronous.rollout_side`, the key in
their environment) that connect back to the trainer; each connection carries the run's config
(at once: they start in `setup.build_run`, before the policy loads, and load theirs meanwhile),
then the start step, and process 0's then each scored batch (`RemoteRollouts`). Under torchrun the last
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
the trainer dies (`rollout_side.die_with_parent`). Under torchrun, torchrun ends every rank
when one dies and names its rank and exit code (a trainer rank waiting for a batch stops first,
naming the rollout rank and its error when it sent one; one inside the weight broadcast with
gloo's "connection closed by peer"). A rollout side whose trainers hang up (a run stopped early)
ends quietly. Validation runs in the trainer, on an HF engine over the policy (whatever
`rollout.engine` the rollout side uses), in batches of `rollout.max_batch_tokens` padded tokens.
On GPUs each rollout process sees only its engine's GPUs (`placement.rollout_env`; a rollout rank
pins LOCAL_RANK's before CUDA starts, `placement.pin_rank_devices`). Video tools run their
multi-turn loop on the rollout side, built as colocated (`setup.make_rollouts`); ReMax's greedy
baseline is generated there with the batch's weights and travels with it (`ScoredGroups.greedy`).
LoRA: the rollout side adapts its model as the trainer does (`apply_lora`) and names only the
trained parameters in its hello, so only they travel; vLLM then loads the merged weights, as
colocated. Sequence parallelism: every trainer rank of an SP group takes its data-parallel rank's
share. Not yet: a vLLM tensor-parallel size that does not divide N.
"""
