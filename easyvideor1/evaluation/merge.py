"""Merging the results folders of a sharded run (`eval --shard i/N` on N machines) into one.

`easyvideor1 report SHARD_DIR... --out MERGED` calls `merge_results`: every folder must hold
the same settings (equal `hash` in settings.json: same model, budget, prompts, sampling, judge),
each benchmark's rows are the union of the shards' rows, and a sample id present in two shards
is an error (the shards overlapped: a different N or i was used for one of them). The merged
folder is an ordinary results folder (settings.json + <benchmark>.jsonl), so `report`,
`report --compare` and a resume with `eval --out MERGED` all work on it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from easyvideor1.evaluation.html_report import RUN_FILE
from easyvideor1.evaluation.results import SETTINGS_FILE, ResultStore, SettingsMismatch, read_results
from easyvideor1.evaluation.settings import differences

log = logging.getLogger(__name__)


def merge_results(dirs: list[str | os.PathLike], out: str | os.PathLike) -> dict[str, int]:
    """Write the union of the results folders `dirs` into `out`; returns {benchmark: rows}.
    Shards that recorded their place (`run.json`: shard i/N, samples over all shards) are also
    checked for a missing or repeated shard; a short merge is written but warned about."""
    dirs = [Path(d) for d in dirs]
    stored = []
    for d in dirs:
        path = d / SETTINGS_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist: {d} is not a results folder of `easyvideor1 eval`")
        stored.append(json.loads(path.read_text(encoding="utf-8")))
    for d, s in zip(dirs[1:], stored[1:]):
        if s["hash"] != stored[0]["hash"]:
            lines = "; ".join(differences(stored[0]["settings"], s["settings"]))
            raise SettingsMismatch(f"{dirs[0]} and {d} were evaluated under different settings ({lines}), so they "
                                   "are not shards of one run; re-run the odd one with the others' settings")
    out = Path(out)
    if out.resolve() in {d.resolve() for d in dirs}:
        raise ValueError(f"--out {out} is one of the shard folders; merge into a new folder")
    plan = _shard_plan(dirs)  # a repeated or mixed shard is refused before rows are read
    out.mkdir(parents=True, exist_ok=True)
    merged: dict[str, dict] = {}
    origin: dict[tuple[str, str], Path] = {}
    for d in dirs:
        for stem, rows in read_results(d).items():
            for row in rows:
                if (stem, row.id) in origin:
                    raise ValueError(f"sample {row.id!r} of {stem} is in both {origin[(stem, row.id)]} and {d}: "
                                     "the shards overlap (were they run with the same --shard N?)")
                origin[(stem, row.id)] = d
                merged.setdefault(stem, {})[row.id] = row
    shutil.copyfile(dirs[0] / SETTINGS_FILE, out / SETTINGS_FILE)
    if (dirs[0] / RUN_FILE).exists():  # where the samples are, for the HTML report's thumbnails
        info = json.loads((dirs[0] / RUN_FILE).read_text(encoding="utf-8"))
        (out / RUN_FILE).write_text(json.dumps({**info, "shard": None}, indent=2) + "\n", encoding="utf-8")
    if plan is not None:
        _warn_short(plan, merged)
    counts = {}
    for stem, rows in merged.items():
        path = out / f"{stem}.jsonl"
        if path.exists():
            path.unlink()  # a merge is rebuilt from the shards, never appended to
        store = ResultStore(path)
        for row in rows.values():
            store.append(row)
        store.close()
        counts[stem] = len(rows)
    return counts


def _shard_plan(dirs: list[Path]) -> tuple[int, list[int], dict[str, int]] | None:
    """(N, missing shard indices, samples per benchmark over all shards) of recorded shards;
    None when some folder recorded no shard (older or unsharded runs: nothing to check)."""
    infos = [json.loads((d / RUN_FILE).read_text(encoding="utf-8")) for d in dirs if (d / RUN_FILE).exists()]
    shards = [tuple(i["shard"]) for i in infos if i.get("shard")]
    if len(shards) != len(dirs):
        return None
    counts = {n for _, n in shards}
    if len(counts) > 1:
        raise ValueError(f"the folders are shards of different splits ({', '.join(f'{i}/{n}' for i, n in shards)}): "
                         "run every shard with the same N")
    n = counts.pop()
    seen = sorted(i for i, _ in shards)
    if len(set(seen)) != len(seen):
        raise ValueError(f"shard folders repeat a shard: {', '.join(f'{i}/{n}' for i in seen)}")
    return n, sorted(set(range(n)) - set(seen)), infos[0].get("totals", {})


def _warn_short(plan: tuple[int, list[int], dict[str, int]], merged: dict[str, dict]) -> None:
    n, missing, totals = plan
    for stem, total in totals.items():
        have = len(merged.get(stem, {}))
        if missing or have < total:
            log.warning("%s: %d of %d samples merged%s; the report covers only those", stem, have, total,
                        f" (shards {', '.join(f'{i}/{n}' for i in missing)} missing)" if missing else "")
