"""Sample loading: JSON / JSONL / Parquet, the real benchmark files, and every bad-record class."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from benchmark_annotations import ROOT as ANNOTATIONS
from benchmark_annotations import needs_annotations

from easyvideor1.data.loading import FIELD_ALIASES, DataError, load_records, load_samples, record_to_sample

GOOD = [
    {"problem_id": "a", "problem": "What colour?", "answer": "B", "problem_type": "multiple choice",
     "videos": ["clips/a.mp4"], "options": ["A. red", "B. blue"], "custom": 7},
    {"problem_id": "b", "problem": "<image> How many?", "answer": 3, "problem_type": "numerical",
     "images": ["img/b.png"]},
    {"problem_id": "c", "problem": "2+2?", "answer": "4", "problem_type": "math"},
]


def _write(tmp_path, rows, fmt):
    path = tmp_path / f"data.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:  # every row has every column in a real Parquet file (absent values are null)
        keys = sorted({k for r in rows for k in r})
        pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), path)
    return path


@pytest.mark.parametrize("fmt", ["json", "jsonl", "parquet"])
def test_formats_load_the_same_samples(tmp_path, fmt):
    rows = [dict(r, answer=str(r["answer"])) for r in GOOD] if fmt == "parquet" else GOOD
    samples = load_samples(_write(tmp_path, rows, fmt), data_root="/data")
    assert [s.problem_id for s in samples] == ["a", "b", "c"]
    a, b, c = samples
    assert a.videos == ["/data/clips/a.mp4"] and a.data_type == "video"
    assert a.options == ["A. red", "B. blue"] and a.extra["custom"] == 7
    assert b.images == ["/data/img/b.png"] and b.data_type == "image" and b.answer == "3"
    assert c.data_type == "text" and not c.videos and not c.images
    assert a.to_dict()["custom"] == 7 and a.to_dict()["problem_id"] == "a"


def test_relative_paths_default_to_the_file_folder(tmp_path):
    samples = load_samples(_write(tmp_path, GOOD[:1], "jsonl"))
    assert samples[0].videos == [str(tmp_path / "clips" / "a.mp4")]


BAD = {
    "no problem": {"answer": "A", "problem_type": "multiple choice"},
    "no answer": {"problem": "q", "problem_type": "numerical"},
    "no problem_type": {"problem": "q", "answer": "1"},
    "bad data_type": {"problem": "q", "answer": "1", "problem_type": "numerical", "data_type": "audio"},
    "video without file": {"problem": "q", "answer": "1", "problem_type": "numerical", "data_type": "video"},
    "options not a list": {"problem": "q", "answer": "A", "problem_type": "multiple choice", "options": 5},
    "clip end before start": {"problem": "q", "answer": "A", "problem_type": "multiple choice",
                              "path": "v.mp4", "start": 5.0, "end": 2.0},
    "tools not a list of names": {"problem_id": "t", "problem": "q", "answer": "1", "problem_type": "numerical",
                                  "tools": "crop_video"},
}


@pytest.mark.parametrize("name", list(BAD))
def test_each_bad_record_class_is_named(tmp_path, name):
    rows = [GOOD[2], BAD[name], dict(GOOD[2], problem_id="d")]
    path = _write(tmp_path, rows, "jsonl")
    result = load_records(path)
    assert [s.problem_id for s in result.samples] == ["c", "d"]  # valid data around it survives
    assert len(result.problems) == 1 and result.problems[0].index == 1
    with pytest.raises(DataError, match="record 1"):
        load_samples(path, on_error="fail")
    assert [s.problem_id for s in load_samples(path, on_error="skip")] == ["c", "d"]


@pytest.mark.parametrize("tools", ["crop_video", [1], {"crop_video": True}])
def test_a_tools_value_that_is_not_a_list_of_names_is_named(tmp_path, tools):
    rows = [GOOD[2], dict(GOOD[2], problem_id="t", tools=tools), dict(GOOD[2], problem_id="d")]
    (problem,) = load_records(_write(tmp_path, rows, "jsonl")).problems
    assert str(problem).startswith("record 1 (problem_id=t): 'tools' must be a list of tool names")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_tools_load_and_round_trip(tmp_path, fmt):
    """Absent (Parquet: null) is None, every tool of the run; a list, [] included, is kept."""
    rows = [dict(GOOD[2], problem_id="all"), dict(GOOD[2], problem_id="none", tools=[]),
            dict(GOOD[2], problem_id="zoom", tools=["zoom_frame", "magnify"])]
    samples = load_samples(_write(tmp_path, rows, fmt))
    assert [s.tools for s in samples] == [None, [], ["zoom_frame", "magnify"]]
    assert [s.offered_tools(["crop_video", "zoom_frame"]) for s in samples] == [["crop_video", "zoom_frame"], [],
                                                                                ["zoom_frame"]]
    (tmp_path / "again").mkdir()
    again = load_samples(_write(tmp_path / "again", [s.to_dict() for s in samples], "jsonl"))
    assert [s.tools for s in again] == [None, [], ["zoom_frame", "magnify"]] and "tools" not in again[0].extra


def test_broken_jsonl_line_is_reported_and_the_rest_loads(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GOOD[2]) + "\n{not json\n" + json.dumps(dict(GOOD[2], problem_id="z")) + "\n")
    result = load_records(path)
    assert [s.problem_id for s in result.samples] == ["c", "z"]
    assert "line 2 is not valid JSON" in str(result.problems[0])


def test_duplicate_ids_stay_unique_and_stable(tmp_path):
    rows = [GOOD[2], GOOD[2], GOOD[2]]
    samples = load_samples(_write(tmp_path, rows, "jsonl"))
    assert [s.problem_id for s in samples] == ["c", "c#2", "c#3"]
    assert samples[1].extra["original_problem_id"] == "c"


def test_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_samples(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(DataError, match="unsupported data file type"):
        load_samples(tmp_path / "x.csv")


# Where each field of FIELD_ALIASES lands on the Sample, and a value for it.
ALIAS_VALUES = {"problem": ("problem", "How many?"), "answer": ("answer", "3"), "videos": ("videos", ["/d/v.mp4"]),
                "images": ("images", ["/d/i.png"]), "video_start": ("video_start", 1.0),
                "video_end": ("video_end", 9.0)}


ALIAS_CONTEXT = {("images", "path"): {"data_type": "image"}}  # what else an alias needs (its table row says it)


@pytest.mark.parametrize("field", list(FIELD_ALIASES))
def test_each_documented_alias_is_read_into_its_field(field):
    """The data-format page's alias table is generated from FIELD_ALIASES: each alias loads."""
    attr, value = ALIAS_VALUES[field]
    base = {"problem": "q", "answer": "1", "problem_type": "numerical"}
    for alias in FIELD_ALIASES[field][0]:
        raw = {k: v for k, v in base.items() if k != field} | {alias: value} | ALIAS_CONTEXT.get((field, alias), {})
        assert getattr(record_to_sample(raw, 0, "/d"), attr) == value, alias


@pytest.mark.parametrize("raw, typo", [
    ({"probelm": "q", "answer": "1", "problem_type": "numerical"}, "probelm"),
    ({"problem": "q", "awnser": "1", "problem_type": "numerical"}, "awnser"),
    ({"problem": "q", "answer": "1", "problem_typ": "numerical"}, "problem_typ"),
    ({"problem": "q", "answer": "1", "problem_type": "numerical", "data_type": "video", "vidoes": ["v.mp4"]},
     "vidoes"),
])
def test_a_missing_field_names_a_misspelt_one(raw, typo):
    with pytest.raises(DataError, match="missing|names no video") as info:
        record_to_sample(raw, 0, "/d")
    assert f"(found '{typo}')" in str(info.value), str(info.value)
    with pytest.raises(DataError) as plain:  # a field that is not near the missing one: no hint
        record_to_sample({k: v for k, v in raw.items() if k != typo} | {"comment": "x"}, 0, "/d")
    assert "found" not in str(plain.value)


@needs_annotations
@pytest.mark.parametrize("path", sorted(ANNOTATIONS.glob("*.json*")) if ANNOTATIONS.is_dir() else [],
                         ids=lambda p: p.name)
def test_real_benchmark_files_load_every_record(path):
    raw = (json.loads(path.read_text()) if path.suffix == ".json"
           else [json.loads(l) for l in path.read_text().splitlines() if l.strip()])
    result = load_records(path, data_root="/bench")
    assert result.problems == []
    assert len(result.samples) == len(raw)
    assert len({s.problem_id for s in result.samples}) == len(raw)
    for r, s in zip(raw, result.samples):
        assert s.answer == str(r.get("solution", r.get("answer")))
        assert s.problem_type == r["problem_type"]
        assert s.videos == [str(Path("/bench") / r["path"])]  # every benchmark record names its video
        if r.get("image_path"):
            assert s.images[-1].endswith(Path(r["image_path"]).name)
        if "start" in r:
            assert (s.video_start, s.video_end) == (r["start"], r["end"])
        if r.get("options"):
            assert isinstance(s.options, list) and all(isinstance(o, str) for o in s.options)


def test_video_r1_records_of_every_data_type_load_unchanged(tmp_path):
    """Video-R1-260k's shapes: an image record names its image `path` (with `data_type: image`), a
    video record its video; both load (issue 59, B2: the image record was refused) and check clean."""
    import numpy as np
    from PIL import Image

    from easyvideor1.data.checks import check_file
    from easyvideor1.vision.encode import write_video

    Image.fromarray(np.zeros((56, 56, 3), np.uint8)).save(tmp_path / "geo.png")
    write_video(tmp_path / "clip.mp4", np.zeros((8, 56, 56, 3), np.uint8), 4.0)
    rows = [
        {"problem_id": 1, "problem": "What is the angle? <image>", "data_type": "image", "problem_type": "numerical",
         "options": [], "process": "", "solution": "<answer>30</answer>", "path": "./geo.png",
         "data_source": "Geometry3K"},
        {"problem_id": 2, "problem": "What happens? <video>", "data_type": "video", "problem_type": "multiple choice",
         "options": ["A. rise", "B. fall"], "process": "", "solution": "<answer>B</answer>", "path": "./clip.mp4",
         "data_source": "LLaVA-Video-178K"},
    ]
    data = tmp_path / "video_r1.json"
    data.write_text(json.dumps(rows))
    image, video = load_samples(data)
    assert (image.images, image.videos, image.data_type) == ([str(tmp_path / "geo.png")], [], "image")
    assert (video.videos, video.images, video.data_type) == ([str(tmp_path / "clip.mp4")], [], "video")
    report = check_file(str(data))
    assert (report.total, report.problems) == (2, []), report.problems
