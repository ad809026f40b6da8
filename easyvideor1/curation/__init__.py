"""Data curation before training: pass-rate filtering and offline trajectories for hybrid groups.

    input records --stream--> frames + prompt (loading pool) --k copies--> engine or endpoint
        --> k responses --> rewards --> one row per sample (append-only, resumable by id)

`pass_rate.py` keeps the samples whose group has a learning signal (0 < pass@k < 1);
`trajectories.py` writes each sample's `offline_output` from a teacher's correct response.
"""
