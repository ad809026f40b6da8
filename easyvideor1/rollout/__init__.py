"""Rollout: generate responses from the current policy (the arrow `prompt -> rollout`).

base.py (the `RolloutEngine` protocol, `Prompt`, `SamplingParams`, the log-prob convention),
sampling.py (the HF engine's sampler), hf_engine.py (`HFEngine`), vllm_engine.py (`VLLMEngine`,
the only module importing vllm), parity.py (engine vs trainer log-prob report).
"""
