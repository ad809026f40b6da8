"""The memory plan (`easyvideor1 plan`): the bytes one GPU of a training run needs, by part and
phase, computed from the run's config and its model's shape before anything is loaded or run, so
that an 8-GPU run can be checked on a laptop.

    model.path / --model-config -> shapes.read_shape -> ModelShape
    config + ModelShape + --gpus, --gpu-memory-gib -> memory.from_config -> Workload
    ModelShape + Workload -> memory.plan_memory -> Plan -> memory.render_plan (+ memory.advice)

`shapes` knows models, `memory` knows training: `memory` reads a `ModelShape` and never a model,
`shapes` knows nothing of a run. Each name says what of the plan its module holds.

`shapes`: the shape of a model read from its config.json without loading a weight (`read_shape`:
a local folder or config.json, a name of the built-in table `KNOWN_CONFIGS`, or `tiny:FAMILY[:SIZE]`,
the tiny model `easyvideor1 demo` builds). It builds the model on the meta device, so the parameter
counts are exact for every family (vision tower and mergers included), and reads the language
model's and the vision tower's widths that the activation formulas use (`ModelShape`).

`memory`: the per-GPU memory model. `from_config` takes the settings of a `Config` that decide
memory (`Workload`); `plan_memory` counts the FSDP2-sharded state (parameters, gradients, AdamW,
a reference model), the FSDP buffers, the activations per token of a packed micro-batch row (what
autograd saves in each decoder layer and vision block), the log-prob head's chunk and colocated
vLLM's share, for the rollout and the update phase (`Plan`); `advice` names the settings that
would make a plan that does not fit fit, and `render_plan` prints the table. Its formulas are
checked against CPU measurements by `benchmarks/plan_check.py` (tests/training/test_memory_plan.py).
"""
