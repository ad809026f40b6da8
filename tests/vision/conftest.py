"""Session fixtures: a folder of real media files written once with our own encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from vision_media import VIDEO_SPECS, moving_bar, write_broken

from easyvideor1.vision.encode import write_video


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory) -> Path:
    """A folder with every test video, three images and the broken files."""
    root = tmp_path_factory.mktemp("media")
    for i, s in enumerate(VIDEO_SPECS):
        write_video(root / s.name, moving_bar(s.frames, s.height, s.width, seed=i), s.fps, gop=s.gop)
    from PIL import Image

    picture = moving_bar(1, 120, 200)[0]
    Image.fromarray(picture).save(root / "rgb.png")
    Image.fromarray(picture).save(root / "photo.jpg", quality=90)
    rgba = np.concatenate([picture, np.full(picture.shape[:2] + (1,), 128, np.uint8)], -1)
    Image.fromarray(rgba, "RGBA").save(root / "alpha.png")
    write_broken(root)
    return root


@pytest.fixture(scope="session")
def broken_videos() -> dict[str, str]:
    """Broken video file name -> the reason code decode_video (backend auto) must give."""
    return {
        "absent.mp4": "missing",
        "empty.mp4": "empty",
        "text.mp4": "not_a_video",
        "truncated.mp4": "not_a_video",
        "damaged.mp4": "corrupt",
        "noframes.avi": "no_frames",
    }


@pytest.fixture(scope="session")
def broken_images() -> dict[str, str]:
    """Broken image file name -> the reason code decode_image must give."""
    return {"absent.png": "missing", "text.png": "not_an_image", "truncated.png": "corrupt"}
