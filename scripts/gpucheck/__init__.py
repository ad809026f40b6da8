"""The pieces of `scripts/gpu_check.py` (run that script; its docstring says what is measured):
`shapes` (the models and workloads, built locally with random weights), `flops` (what the update
processes and its FLOPs, attention included), `kernels` (which attention kernels ran; the 60-second
A1 check), `child` (one model's run, in its own process) and `parent` (orchestration, the table)."""
