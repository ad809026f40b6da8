"""Any sample file as a benchmark: `--benchmarks path/to/val.jsonl`.

Users evaluate their own held-out sets this way (and the demo its synthetic validation set):
every record in the sample schema, scored by the reward scorer of its `problem_type`,
reported overall and per problem type. The results file is `file-<stem>.jsonl`.
"""

from __future__ import annotations

from pathlib import Path

from easyvideor1.evaluation.adapters.base import Benchmark
from easyvideor1.records import Sample

FILE_SUFFIXES = (".json", ".jsonl", ".parquet")
FILE_PREFIX = "file-"


def problem_type_label(sample: Sample) -> dict[str, str]:
    """{"problem_type": ...}."""
    return {"problem_type": sample.problem_type}


def is_file_benchmark(name: str) -> bool:
    """True for a path to a sample file, or the `file-<stem>` name its results are stored under."""
    return name.lower().endswith(FILE_SUFFIXES) or name.startswith(FILE_PREFIX)


def file_benchmark(path_or_name: str) -> Benchmark:
    """A benchmark over one sample file (media resolve against the data root given to `load`,
    default the file's folder). Given `file-<stem>` (a results file name), only its aggregate
    is usable: it knows no file to load."""
    if path_or_name.startswith(FILE_PREFIX) and not path_or_name.lower().endswith(FILE_SUFFIXES):
        name, files = path_or_name, ()
    else:
        path = Path(path_or_name)
        name, files = FILE_PREFIX + path.stem, (str(path.resolve()),)
    return Benchmark(name=name, title=name[len(FILE_PREFIX):], files=files,
                     source="user sample file, scored per problem_type by the reward scorers",
                     breakdowns=("problem_type",), labels=problem_type_label)
