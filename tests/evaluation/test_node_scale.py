"""Node scale with the tiny model (HF engine, CPU): `--data-parallel 2` (two worker processes,
one results store) resumes a folder a single engine started and gives the single engine's
greedy responses; `--shard i/2` runs on two "machines" split the samples without overlap, and
`report SHARD0 SHARD1 --out MERGED` merges them into the same rows (refusing overlapping shards
and shards of different settings)."""

from __future__ import annotations

import json
import shutil

import pytest

from easyvideor1 import cli
from easyvideor1.data.synth import write_suite
from easyvideor1.models.tiny import build_tiny_model

OPTIONS = ["--engine", "hf", "--dtype", "float32", "--cache-mode", "realtime", "--load-workers", "1",
           "--max-new-tokens", "6", "--fps", "1", "--max-frames", "4", "--video-max-pixels", "12544",
           "--image-max-pixels", "12544"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodescale")
    model = build_tiny_model("qwen2_5_vl", root / "model", seed=0)
    data = write_suite(root / "data", num_train=0, num_val=6, seed=3)["val"]
    single = root / "single"
    assert cli.main(["eval", "--model", str(model), "--benchmarks", str(data), "--out", str(single), *OPTIONS]) == 0
    return root, model, data, single


def _rows(folder):
    return {r["id"]: r for r in map(json.loads, (folder / "file-val.jsonl").read_text().splitlines())}


def _settings(folder):
    return json.loads((folder / "settings.json").read_text())


def test_data_parallel_resumes_into_one_store_with_the_single_engine_responses(setup, tmp_path):
    root, model, data, single = setup
    out = tmp_path / "dp"
    assert cli.main(["eval", "--model", str(model), "--benchmarks", str(data), "--out", str(out),
                     "--max-samples", "2", *OPTIONS]) == 0  # a single engine starts the folder
    assert cli.main(["eval", "--model", str(model), "--benchmarks", str(data), "--out", str(out),
                     "--data-parallel", "2", *OPTIONS]) == 0
    lines = (out / "file-val.jsonl").read_text().splitlines()
    rows, reference = _rows(out), _rows(single)
    assert len(lines) == len(rows) == len(reference) == 6  # each sample once, in one file
    assert {k: r["response"] for k, r in rows.items()} == {k: r["response"] for k, r in reference.items()}
    assert _settings(out)["hash"] == _settings(single)["hash"]  # --data-parallel is not a scoring setting
    assert cli.main(["eval", "--model", str(model), "--benchmarks", str(data), "--out", str(out),
                     "--data-parallel", "2", *OPTIONS]) == 0  # nothing left: no worker, nothing written
    assert (out / "file-val.jsonl").read_text().splitlines() == lines


def test_shards_merge_into_the_single_run(setup, tmp_path, capsys, caplog):
    root, model, data, single = setup
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, folder in enumerate(shards):
        assert cli.main(["eval", "--model", str(model), "--benchmarks", str(data), "--out", str(folder),
                         "--shard", f"{i}/2", *OPTIONS]) == 0
    parts = [set(_rows(f)) for f in shards]
    assert parts[0] and parts[1] and not parts[0] & parts[1]
    merged = tmp_path / "merged"
    assert cli.main(["report", *map(str, shards), "--out", str(merged)]) == 0
    assert {k: r["response"] for k, r in _rows(merged).items()} == {k: r["response"] for k, r in _rows(single).items()}
    assert json.loads((merged / "report.json").read_text())["benchmarks"]["file-val"]["count"] == 6
    capsys.readouterr()

    copy = tmp_path / "copy"
    shutil.copytree(shards[0], copy)
    assert cli.main(["report", str(shards[0]), str(copy), "--out", str(tmp_path / "bad")]) == 2
    assert "repeat a shard: 0/2, 0/2" in capsys.readouterr().err
    (copy / "run.json").unlink()  # unrecorded shards: the overlapping rows themselves are refused
    assert cli.main(["report", str(shards[0]), str(copy), "--out", str(tmp_path / "bad")]) == 2
    assert "in both" in capsys.readouterr().err
    from easyvideor1.evaluation.merge import merge_results

    with caplog.at_level("WARNING"):
        assert merge_results([shards[0]], tmp_path / "half") == {"file-val": len(parts[0])}
    assert f"{len(parts[0])} of 6 samples merged (shards 1/2 missing)" in caplog.text
    other = tmp_path / "other"
    assert cli.main(["eval", "--model", str(model), "--benchmarks", str(data), "--out", str(other),
                     "--shard", "1/2", *OPTIONS, "--max-new-tokens", "5"]) == 0
    capsys.readouterr()
    assert cli.main(["report", str(shards[0]), str(other), "--out", str(tmp_path / "bad2")]) == 2
    assert "sampling.max_new_tokens: 6 != 5" in capsys.readouterr().err


def test_gpus_are_split_into_tensor_parallel_groups():
    from easyvideor1.errors import UserError
    from easyvideor1.evaluation.parallel import device_groups

    assert device_groups(2, 2, ["4", "5", "6", "7"]) == ["4,5", "6,7"]
    assert device_groups(3, 1, ["0", "1", "2", "3"]) == ["0", "1", "2"]
    assert device_groups(2, 1, []) == [None, None]  # CPU: CUDA_VISIBLE_DEVICES left alone
    with pytest.raises(UserError, match="needs 4 GPUs; 3 visible"):
        device_groups(2, 2, ["0", "1", "2"])
