"""The training state on disk: checkpoints (save atomically, resume exactly, on any number of
processes) and the exported model folders (HF, PEFT) that `eval`, vLLM and `from_pretrained` read.
No file written here is a pickle, and saving or exporting a run never gathers the whole model or
optimizer on one rank.

    trainer -> checkpoint.save_checkpoint -> shards.write_shard (per rank: weights, optimizer)
                                          -> files.write_state (optimizer groups, schedule, RNGs, trainer)
    resume  -> checkpoint.load_checkpoint <- shards.Shards (the rows this rank holds) + files.read_state
    end of training -> export.export_model -> export.write_hf -> hf_shards.ShardWriter
    `easyvideor1 export` -> export.export_checkpoint <- checkpoint.read_weights

`checkpoint` is the one entry point for a checkpoint folder; `shards` and `files` are its two
formats, `hf_shards` is `export`'s. A checkpoint file that is damaged, replaced or a pickle is
refused with a `files.StateFileError` (a `UserError`: one line, no traceback).

`checkpoint`: a checkpoint folder `step-NNNNNN/` and the run's use of it: `save_checkpoint` (every
rank writes its shard into a temporary folder that rank 0 renames once all succeeded; the newest
`checkpoint.keep` are kept), `resolve_resume` and `load_checkpoint`, the RNG states of every rank,
and what the commands read of a checkpoint (`named_by`, `read_meta`, `recorded_config`: the run's
config it holds; `read_weights`: the whole model, in one process).

`shards`: per-rank tensor shards (`model.rank00003.safetensors` + `.json`): each rank writes the
slices it holds, tensor by tensor; `Shards` reads any box of any tensor by global offsets, so a
checkpoint written by 2 processes resumes on 1 and back.

`files`: nested states (optimizer groups, LR schedule, RNGs, trainer state) as JSON + safetensors,
a closed set of tags that can name no code (`write_state`, `read_state`, `StateFileError`).

`hf_shards`: an HF weights folder written one tensor at a time, in safetensors files of bounded
size with `save_pretrained`'s names and index (`ShardWriter`), so exporting never holds the model.

`export`: the trained policy as an HF folder (`write_hf`: gathered one tensor at a time under
FSDP2, a LoRA policy merged, the settings `eval` reads beside it with `export_model`) or a PEFT
adapter folder (`export_adapter`), at the end of training or from a checkpoint (`export_checkpoint`,
the `export` command).
"""
