"""Each rank's balanced slots of one global batch (torchrun, 2 CPU processes, gloo) when the ranks
read the media differently: sample 0's video is unreadable on rank 1 only (a transient read
error, or another decoder on another node). Writes `<out>/slots-rank<r>.json`. A test helper,
run as a script:

    rank_balance_worker.py SAMPLES_JSONL OUT_DIR
"""

import json
import sys
from pathlib import Path

from easyvideor1 import distributed
from easyvideor1.records import Sample
from easyvideor1.training.fsdp import init_distributed
from easyvideor1.training.rank_balance import rank_slots
from easyvideor1.vision.config import VisionConfig

CFG = VisionConfig(family="qwen2_5_vl", max_frames=8, video_min_pixels=3136, video_max_pixels=12544)
BROKEN = {1: 0}  # rank -> the sample whose video that rank cannot read


def main(samples_path: str, out: str) -> None:
    rank, world, _ = init_distributed()
    rows = [json.loads(line) for line in Path(samples_path).read_text().splitlines()]
    samples = [Sample(problem=r["problem"], answer=r["answer"], problem_type=r["problem_type"],
                      videos=list(r.get("videos", [])), problem_id=r["problem_id"]) for r in rows]
    if rank in BROKEN:
        samples[BROKEN[rank]].videos = [str(Path(out) / "missing.mp4")]
    slots = rank_slots(samples, rank, world, CFG)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"slots-rank{rank}.json").write_text(json.dumps(slots))
    distributed.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
