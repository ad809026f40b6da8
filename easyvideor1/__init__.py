"""easyvideor1: RL post-training and fast evaluation of video-understanding VLMs.

Kept import-light on purpose: the torchvision hook installed by scripts/setup.sh imports
a submodule of this package at interpreter start.
"""

__version__ = "0.1.0"
