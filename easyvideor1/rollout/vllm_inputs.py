"""What vLLM is given, built without vLLM: the request of a prompt (text + uint8 media), the
per-prompt media limits, and an untied view of a model folder whose LM head is tied.

Kept apart from `vllm_engine.py` (the only module that imports vllm) so both engines' inputs
can be built and tested where vllm is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from easyvideor1.data.loading import DataError
from easyvideor1.prompts import Prompt
from easyvideor1.records import Sample


def _video_item(frames) -> tuple:
    return frames.pixels.permute(0, 2, 3, 1).contiguous().numpy(), frames.metadata.to_hf()


def _image_item(frames):
    return frames.pixels[0].permute(1, 2, 0).contiguous().numpy()


def request_for(prompt: Prompt) -> dict:
    """vLLM's input for one prompt: chat-templated text + the media, untouched. A tool-loop
    continuation goes in as its placeholder token ids (`Prompt.placeholder_ids`): vLLM expands
    every placeholder with its medium, wherever it is in the sequence."""
    videos = [_video_item(fr) for fr in prompt.frames if fr.metadata is not None]
    images = [_image_item(fr) for fr in prompt.frames if fr.metadata is None]
    request: dict = ({"prompt": prompt.inputs.prompt_text} if prompt.placeholder_ids is None
                     else {"prompt_token_ids": list(prompt.placeholder_ids)})
    mm = {}
    if videos:
        mm["video"] = videos if len(videos) > 1 else videos[0]
    if images:
        mm["image"] = images if len(images) > 1 else images[0]
    if mm:
        request["multi_modal_data"] = mm
        # Frames are already sampled and sized (multiples of the grid factor, checked by
        # build_inputs), so neither videos nor images may be resampled or resized.
        request["mm_processor_kwargs"] = {"do_sample_frames": False, "do_resize": False}
    return request


def check_media_limits(samples: list[Sample], limits: dict[str, int]) -> None:
    """Raise `DataError` naming the samples that carry more videos or images than vLLM's
    per-prompt limits (`rollout.limit_videos` / `rollout.limit_images`)."""
    over = [(s, kind, len(media)) for s in samples
            for kind, media in (("video", s.videos), ("image", s.images)) if len(media) > limits.get(kind, 0)]
    if not over:
        return
    shown = "; ".join(f"sample {s.problem_id!r} has {k} {kind}s" for s, kind, k in over[:5])
    more = f" (and {len(over) - 5} more)" if len(over) > 5 else ""
    need = {kind: max(k for _, kd, k in over if kd == kind) for _, kind, _ in over}
    fix = " ".join(f"rollout.limit_{kind}s={k}" for kind, k in need.items())
    raise DataError(
        f"{shown}{more}, over the vLLM engine's per-prompt limit (video {limits.get('video', 0)}, image "
        f"{limits.get('image', 0)}); raise it ({fix}; vLLM reserves encoder memory for that many) or drop those "
        f"samples"
    )


def ties_embeddings(model_path: Path) -> bool:
    from transformers import AutoConfig

    return bool(getattr(AutoConfig.from_pretrained(model_path), "tie_word_embeddings", False))


def untied_view(model_path: Path, root: str | os.PathLike | None) -> Path:
    """A new folder vLLM loads as an untied model: links to `model_path`'s files, its config
    with `tie_word_embeddings: false` (text config too), and `lm_head.safetensors` holding the
    input embedding as `lm_head.weight` (added to the shard index when there is one)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = Path(tempfile.mkdtemp(prefix="evr1-vllm-untied-", dir=root))
    embedding, has_head = None, False
    for f in sorted(model_path.iterdir()):
        if f.name == "config.json":
            config = json.loads(f.read_text())
            config["tie_word_embeddings"] = False
            if isinstance(config.get("text_config"), dict):
                config["text_config"]["tie_word_embeddings"] = False
            (folder / f.name).write_text(json.dumps(config, indent=2))
        elif f.name.endswith(".safetensors.index.json"):
            index = json.loads(f.read_text())
            index["weight_map"].setdefault("lm_head.weight", "lm_head.safetensors")
            (folder / f.name).write_text(json.dumps(index, indent=2))
        else:
            (folder / f.name).symlink_to(f.resolve())
        if f.name.endswith(".safetensors"):
            with safe_open(str(f), framework="pt") as st:
                has_head |= "lm_head.weight" in st.keys()
                name = next((k for k in st.keys() if k.endswith("embed_tokens.weight") and "visual" not in k), None)
                if name is not None and embedding is None:
                    embedding = st.get_tensor(name)
    if embedding is None:
        shutil.rmtree(folder, ignore_errors=True)
        raise ValueError(f"{model_path}: no *embed_tokens.weight in its safetensors files, cannot untie the LM head")
    if not has_head:  # some tied checkpoints store the head anyway (equal to the embedding)
        save_file({"lm_head.weight": embedding.contiguous()}, str(folder / "lm_head.safetensors"))
    return folder
