"""The benchmark registry: name -> `Benchmark` (the paper's Table 2, plus file variants).

`get_benchmark(name)` also accepts a path to a sample file (a generic benchmark scored per
problem_type) and the `file-<stem>` name such a benchmark's results are stored under.
"""

from __future__ import annotations

from easyvideor1.evaluation.adapters.base import Benchmark
from easyvideor1.evaluation.adapters.clips import LIVESPORTS, ODVBENCH
from easyvideor1.evaluation.adapters.generic import file_benchmark, is_file_benchmark
from easyvideor1.evaluation.adapters.grounding import CHARADES_STA, STVG
from easyvideor1.evaluation.adapters.multiple_choice import MMVU, MMVU_ALL, MOTIONBENCH, VIDEOMME
from easyvideor1.evaluation.adapters.mvbench import MVBENCH
from easyvideor1.evaluation.adapters.official import HOLMES, LONGVIDEOBENCH, LVBENCH, MLVU, MLVU_DEV
from easyvideor1.evaluation.adapters.open_ended import VCRBENCH, VIDEOREASONBENCH
from easyvideor1.evaluation.adapters.ovobench import OVOBENCH
from easyvideor1.evaluation.adapters.reasoning import LONGVIDEOREASON, MINERVA
from easyvideor1.evaluation.adapters.tempcompass import TEMPCOMPASS
from easyvideor1.evaluation.adapters.videomathqa import VIDEOMATHQA
from easyvideor1.evaluation.adapters.videomme_v2 import VIDEOMME_V2
from easyvideor1.evaluation.adapters.videommmu import VIDEOMMMU, VIDEOMMMU_QUESTION_ONLY, add_delta_knowledge
from easyvideor1.evaluation.adapters.vsibench import VSIBENCH

BENCHMARKS: dict[str, Benchmark] = {
    "videomme": VIDEOMME,
    "videomme_v2": VIDEOMME_V2,
    "mvbench": MVBENCH,
    "tempcompass": TEMPCOMPASS,
    "motionbench": MOTIONBENCH,
    "lvbench": LVBENCH,
    "longvideobench": LONGVIDEOBENCH,
    "mlvu": MLVU,
    "mlvu-dev": MLVU_DEV,
    "holmes": HOLMES,
    "minerva": MINERVA,
    "vcrbench": VCRBENCH,
    "videoreasonbench": VIDEOREASONBENCH,
    "longvideoreason": LONGVIDEOREASON,
    "mmvu": MMVU,
    "mmvu-all": MMVU_ALL,
    "videommmu": VIDEOMMMU,
    "videommmu-question-only": VIDEOMMMU_QUESTION_ONLY,
    "videomathqa": VIDEOMATHQA,
    "vsibench": VSIBENCH,
    "charades_sta": CHARADES_STA,
    "stvg": STVG,
    "ovobench": OVOBENCH,
    "odvbench": ODVBENCH,
    "livesports3k_qa": LIVESPORTS,
}
# The 22 benchmarks of the paper's Table 2 (the others are file variants of the same ones).
PAPER_BENCHMARKS = (
    "videomme", "videomme_v2", "mvbench", "tempcompass", "motionbench", "lvbench",
    "longvideobench", "mlvu", "holmes", "minerva", "vcrbench", "videoreasonbench",
    "longvideoreason", "mmvu", "videommmu", "videomathqa", "vsibench", "charades_sta", "stvg",
    "ovobench", "odvbench", "livesports3k_qa",
)


def get_benchmark(name: str) -> Benchmark:
    """The registered benchmark, or a file benchmark for a sample-file path / `file-<stem>`.
    Anything else is an error listing the registered names."""
    if name in BENCHMARKS:
        return BENCHMARKS[name]
    if is_file_benchmark(name):
        return file_benchmark(name)
    raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}, "
                     "or give the path of a .json/.jsonl/.parquet sample file")


# Numbers that need several benchmarks' results: called on a run's aggregates by the report.
CROSS_METRICS = (add_delta_knowledge,)

__all__ = ["BENCHMARKS", "CROSS_METRICS", "PAPER_BENCHMARKS", "Benchmark", "get_benchmark"]
