"""Frames for the models: sampling and resizing plans, decoders, and the offline frame cache.

config.py (VisionConfig) -> sampling.py (which frames, what size; budget.py: the most tokens that
makes, for the prompt check at load and `plan`) -> decode.py (torchcodec /
PyAV / PIL, uint8 all the way via resize.py) -> cache.py (entry format, keys, FrameSource reader)
and cache_build.py (build_cache, the `cache` command's engine; commands.py wires the CLI).
encode.py writes videos for the synthetic data, the tests and the benchmarks.
"""
