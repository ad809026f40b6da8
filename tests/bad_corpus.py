"""The bad-input corpus: every kind of broken or unusual record a user's data can hold.

`write_corpus(root)` writes media files and `data.jsonl` (one record per class, its
`problem_id` the class name, plus a malformed line) and returns the table of classes with
what makes each special; the outcome each command must give is the table in
tests/data/test_bad_corpus.py.

    python tests/bad_corpus.py OUT_DIR      # write it by hand, e.g. to try a command on it
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

from easyvideor1.vision.encode import write_video

MALFORMED = "malformed-jsonl"  # a line that is not JSON: named by its line number


@dataclass(frozen=True)
class Case:
    """One class of input (its record's problem_id) and what makes it special."""

    name: str
    why: str


CASES = (
    Case("valid-video", "a plain short clip"),
    Case("valid-image", "a plain RGB image"),
    Case("valid-text", "a text-only record"),
    Case("vfr-video", "variable frame rate (frames 20 ms and 90 ms apart, alternating)"),
    Case("rotated-video", "a rotation tag in the container"),
    Case("one-frame-video", "a single frame"),
    Case("hour-long-video", "1 hour at 1 fps, 32x32: the frame budget caps the sampling"),
    Case("grayscale-image", "PNG mode L"),
    Case("cmyk-image", "CMYK JPEG"),
    Case("16bit-image", "16-bit PNG (mode I;16)"),
    Case("long-offline-trajectory", "an offline trajectory far longer than the response limit"),
    Case("truncated-video", "the second half of the file is missing"),
    Case("zero-byte-video", "an empty file"),
    Case("non-video", "a text file named .mp4"),
    Case("audio-only-video", "an mp4 with an audio stream only"),
    Case("missing-media", "the video file does not exist"),
    Case("wrong-field-types", "answer is a list, problem a number"),
    Case("unknown-problem-type", "problem_type names no reward family"),
    Case("too-many-placeholders", "two <video> placeholders, one video"),
    Case(MALFORMED, "a line that is not JSON (line 6: named by its position, record 5)"),
)


def _bar(frames: int, size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros((frames, size, size, 3), np.uint8)
    out[:] = rng.integers(0, 255, 3, dtype=np.uint8)
    for t in range(frames):
        x = (t * 3) % (size - 8)
        out[t, :, x:x + 8] = 255
    return out


def _vfr(path: Path) -> None:
    import av

    with av.open(str(path), "w") as box:
        stream = box.add_stream("libx264", rate=30)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuv420p"
        stream.time_base = stream.codec_context.time_base = Fraction(1, 1000)
        pts = 0
        for i, frame in enumerate(_bar(40, 64, 1)):
            f = av.VideoFrame.from_ndarray(frame, format="rgb24")
            f.pts, f.time_base = pts, Fraction(1, 1000)
            pts += 20 if i % 2 else 90  # 50 fps and ~11 fps alternating
            box.mux(stream.encode(f))
        box.mux(stream.encode())


def _rotated(path: Path) -> None:
    import av

    with av.open(str(path), "w") as box:
        stream = box.add_stream("libx264", rate=10)
        stream.width, stream.height = 96, 64
        stream.pix_fmt = "yuv420p"
        stream.metadata["rotate"] = "90"
        for frame in _bar(20, 96, 2)[:, :64]:
            box.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
        box.mux(stream.encode())


def _audio_only(path: Path) -> None:
    import av

    with av.open(str(path), "w") as box:
        stream = box.add_stream("aac", rate=16000)
        stream.layout = "mono"
        t = np.arange(16000) / 16000
        samples = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None]
        for start in range(0, 16000, 1024):
            frame = av.AudioFrame.from_ndarray(samples[:, start:start + 1024], format="fltp", layout="mono")
            frame.sample_rate = 16000
            box.mux(stream.encode(frame))
        box.mux(stream.encode())


def write_corpus(root: str | Path) -> tuple[Path, tuple[Case, ...]]:
    """Write the corpus under `root`; return (data file, the table of cases)."""
    root = Path(root)
    media = root / "media"
    media.mkdir(parents=True, exist_ok=True)
    write_video(media / "valid.mp4", _bar(20, 64, 0), 10.0)
    Image.fromarray(_bar(1, 64, 3)[0]).save(media / "valid.png")
    _vfr(media / "vfr.mp4")
    _rotated(media / "rotated.mp4")
    write_video(media / "one-frame.mp4", _bar(1, 64, 4), 10.0)
    write_video(media / "hour.mp4", _bar(3600, 32, 5), 1.0, gop=600)
    Image.fromarray(_bar(1, 64, 6)[0, :, :, 0], "L").save(media / "gray.png")
    Image.fromarray(_bar(1, 64, 7)[0]).convert("CMYK").save(media / "cmyk.jpg")
    Image.fromarray(_bar(1, 64, 8)[0, :, :, 0].astype(np.uint16) * 257).save(media / "deep.png")
    whole = (media / "valid.mp4").read_bytes()
    (media / "truncated.mp4").write_bytes(whole[: len(whole) // 2])
    (media / "zero.mp4").write_bytes(b"")
    (media / "text.mp4").write_text("this is not a video\n")
    _audio_only(media / "audio.mp4")

    def mc(pid, **fields):
        base = {"problem_id": pid, "problem": "<video> What moves? (A) bar (B) nothing", "answer": "A",
                "problem_type": "multiple choice", "data_type": "video", "options": ["bar", "nothing"]}
        return {**base, **fields}

    def image(pid, file):
        return mc(pid, problem="<image> What color? (A) bar (B) nothing", data_type="image",
                  images=[f"media/{file}"])

    long_output = "<think>" + "step " * 400 + "</think><answer>A</answer>"
    rows = [
        mc("valid-video", videos=["media/valid.mp4"]),
        image("valid-image", "valid.png"),
        {"problem_id": "valid-text", "problem": "What is 2 plus 2?", "answer": "4", "problem_type": "numerical",
         "data_type": "text"},
        mc("vfr-video", videos=["media/vfr.mp4"]),
        mc("rotated-video", videos=["media/rotated.mp4"]),
        mc("one-frame-video", videos=["media/one-frame.mp4"]),
        mc("hour-long-video", videos=["media/hour.mp4"]),
        image("grayscale-image", "gray.png"),
        image("cmyk-image", "cmyk.jpg"),
        image("16bit-image", "deep.png"),
        mc("long-offline-trajectory", videos=["media/valid.mp4"], has_offline_trajectory=True,
           offline_output=long_output),
        mc("truncated-video", videos=["media/truncated.mp4"]),
        mc("zero-byte-video", videos=["media/zero.mp4"]),
        mc("non-video", videos=["media/text.mp4"]),
        mc("audio-only-video", videos=["media/audio.mp4"]),
        mc("missing-media", videos=["media/absent.mp4"]),
        mc("wrong-field-types", videos=["media/valid.mp4"], answer=["A"], problem=7),
        mc("unknown-problem-type", videos=["media/valid.mp4"], problem_type="interpretive dance"),
        mc("too-many-placeholders", problem="<video><video> Which one moves? (A) bar (B) nothing",
           videos=["media/valid.mp4"]),
    ]
    lines = [json.dumps(r) for r in rows]
    lines.insert(5, '{"problem_id": "malformed-jsonl", "problem": "oops", ')  # line 6
    data = root / "data.jsonl"
    data.write_text("\n".join(lines) + "\n")
    return data, CASES


if __name__ == "__main__":
    path, cases = write_corpus(sys.argv[1])
    print(f"wrote {path}: {len(cases)} classes")
