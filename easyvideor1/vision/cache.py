"""The offline frame cache: entry format, keys, atomic writes, and the reader `FrameSource`.

Layout of a cache directory:

    cache_config.json         format version + the `VisionConfig.key_params()` it was built with
    entries/ab/<key>.safetensors   one per (media file, parameters): tensor "frames" [T, 3, H, W]
                              uint8; the safetensors header's metadata holds the source identity,
                              the parameters and the `VideoMetadata` as JSON (no pickle anywhere)
    index.json                "<kind>|<path>|<start>|<end>" -> key, so `cache_only` reads work
                              where the source files are absent
    manifest.jsonl, failures.jsonl   written by `cache_build.build_cache`

Key = hash of the source identity (absolute path, size, mtime in ns; optionally a SHA-256 of
the content), every sampling/resizing parameter (incl. the family's grid factor), the clip
bounds, the media kind and `FORMAT_VERSION`. Entries are written to a temporary name and
renamed, so a reader never sees half an entry; the reader also checks each entry it loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

import torch

from easyvideor1 import testhooks
from easyvideor1.errors import UserError, out_of_space
from easyvideor1.records import Frames, Sample, VideoMetadata
from easyvideor1.vision.config import CACHE_FLAGS, VisionConfig
from easyvideor1.vision.decode import ImageDecodeError, VideoDecodeError, decode_image, decode_video

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CONFIG_FILE = "cache_config.json"
INDEX_FILE = "index.json"
SOURCE_MODES = ("prefer_cache", "cache_only", "realtime")
_HEADER = "easyvideor1"  # the safetensors metadata field holding our JSON header


class CacheError(RuntimeError):
    """A cache that cannot serve a request: missing entry (cache_only), damaged entry, ..."""


class CacheMismatchError(UserError, CacheError):
    """A cache built with other parameters than the config asks for (`stored`: the cache's;
    `detail`: which differ, the message without its advice)."""

    def __init__(self, message: str, stored: dict[str, Any] | None = None, detail: str = ""):
        super().__init__(message)
        self.stored, self.detail = stored or {}, detail or message


def source_identity(path: str, kind: str, content_hash: bool = False) -> dict[str, Any]:
    """What identifies a media file's content: absolute path, size, mtime (ns), optional SHA-256.

    Raises the kind's decode error (`missing`, `unreadable`) when the file cannot be stat'ed.
    """
    error = VideoDecodeError if kind == "video" else ImageDecodeError
    path = os.path.abspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(path, "missing") from None
    except OSError as e:
        raise error(path, "unreadable", str(e)) from None
    ident: dict[str, Any] = {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if content_hash:
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError as e:
            raise error(path, "unreadable", str(e)) from None
        ident["sha256"] = digest.hexdigest()
    return ident


def entry_key(kind: str, source: dict[str, Any], params: dict[str, Any], start: float | None = None,
              end: float | None = None) -> str:
    """Hex key of one cache entry (see the module docstring for what goes in)."""
    blob = json.dumps({"format_version": FORMAT_VERSION, "kind": kind, "source": source, "params": params,
                       "start": start, "end": end}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def entry_path(cache_dir: str | os.PathLike, key: str) -> Path:
    """Where the entry `key` lives under `cache_dir`."""
    return Path(cache_dir) / "entries" / key[:2] / f"{key}.safetensors"


def index_name(kind: str, path: str, start: float | None = None, end: float | None = None) -> str:
    """The `index.json` name of a request (kind, absolute path, clip bounds)."""
    return f"{kind}|{os.path.abspath(path)}|{start}|{end}"


def write_entry(path: Path, frames: Frames, header: dict[str, Any]) -> int:
    """Write `frames` + `header` atomically (temporary file, fsync, rename); returns the bytes written."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}@{socket.gethostname()}")  # unique across nodes
    header = {**header, "video_metadata": frames.metadata.to_dict() if frames.metadata else None}
    try:
        save_file({"frames": frames.pixels.contiguous()}, str(tmp), metadata={_HEADER: json.dumps(header)})
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    except Exception as e:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half entry behind
        full = out_of_space(e, path, "re-run the same command: the entries already written are kept")
        if full is not None:
            raise full from e
        raise
    testhooks.hit("cache.entry")
    os.replace(tmp, path)
    return path.stat().st_size


def read_entry(path: Path, params: dict[str, Any] | None = None) -> tuple[Frames, dict[str, Any]]:
    """Load an entry memory-mapped and check it; raises CacheError naming the file when damaged
    and CacheMismatchError when it was built with other `params`."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            header = json.loads((f.metadata() or {})[_HEADER])
            pixels = f.get_tensor("frames")
    except FileNotFoundError:
        raise
    except Exception as e:
        raise CacheError(f"cache entry {path} is damaged ({type(e).__name__}: {e}); delete it or run "
                         "`easyvideor1 cache --verify` to rebuild it") from e
    if params is not None and header.get("params") != params:
        raise CacheMismatchError(f"cache entry {path}: " + describe_mismatch(header.get("params") or {}, params))
    meta = VideoMetadata.from_dict(header["video_metadata"]) if header.get("video_metadata") else None
    expected_t = len(meta.frames_indices) if meta else 1
    if pixels.dtype != torch.uint8 or pixels.ndim != 4 or pixels.shape[0] != expected_t or pixels.shape[1] != 3:
        raise CacheError(f"cache entry {path} holds {pixels.dtype} {tuple(pixels.shape)}, expected "
                         f"[{expected_t}, 3, H, W] uint8; delete it or run `easyvideor1 cache --verify`")
    return Frames(pixels=pixels, metadata=meta, source=header["source"]["path"], cache_key=header["key"]), header


def describe_mismatch(cached: dict[str, Any], wanted: dict[str, Any]) -> str:
    """Field-by-field list, on one line, of how two parameter sets differ."""
    lines = [f"{k}: cache has {cached.get(k)!r}, config has {wanted.get(k)!r}"
             for k in sorted(set(cached) | set(wanted)) if cached.get(k) != wanted.get(k)]
    return "built with other vision parameters (" + "; ".join(lines) + ")"


def cache_command(cfg: VisionConfig, out: str | os.PathLike, data: str = "FILE") -> str:
    """The `easyvideor1 cache` command line that builds a cache for `cfg` (every pixel-deciding
    field spelled out, so it does not depend on the command's defaults or presets)."""
    flags = " ".join(f"{flag} {getattr(cfg, name)}" for name, flag in CACHE_FLAGS.items())
    return f"easyvideor1 cache --data {data} --out {out} {flags}"


def read_cache_config(cache_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The cache-level `cache_config.json`, or None when `cache_dir` holds no cache yet."""
    path = Path(cache_dir) / CONFIG_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())


def check_cache_config(cache_dir: str | os.PathLike, cfg: VisionConfig) -> dict[str, Any] | None:
    """Raise CacheMismatchError when `cache_dir` was built with other parameters than `cfg`."""
    stored = read_cache_config(cache_dir)
    if stored is None:
        return None
    if stored.get("format_version") != FORMAT_VERSION:
        raise CacheMismatchError(f"cache {cache_dir} has format version {stored.get('format_version')}, this "
                                 f"code reads version {FORMAT_VERSION}; rebuild it with `easyvideor1 cache`")
    if stored.get("params") != cfg.key_params():
        fresh = f"{str(cache_dir).rstrip('/')}-{entry_key('config', {}, cfg.key_params())[:8]}"
        detail = f"frame cache {cache_dir} was " + describe_mismatch(stored.get("params") or {}, cfg.key_params())
        raise CacheMismatchError(
            detail + f". Build a matching cache in a new folder with `{cache_command(cfg, fresh)}` (FILE: the "
                     f"sample file, once per file) and use {fresh} instead, or change the run's vision "
                     "settings (`eval --preset` and its frame options, or the training config's vision "
                     "section) to the cache's values.", stored=stored.get("params") or {}, detail=detail)
    return stored


class FrameSource:
    """Frames for samples, from the cache or by decoding.

    Modes: `prefer_cache` (cache hit, else decode), `cache_only` (a miss is an error),
    `realtime` (always decode). A cache built with other parameters than `cfg` is refused
    at construction in both cache modes.
    """

    def __init__(self, cfg: VisionConfig, cache_dir: str | os.PathLike | None = None,
                 mode: str = "prefer_cache"):
        if mode not in SOURCE_MODES:
            raise ValueError(f"frame source mode {mode!r}; choose one of {', '.join(SOURCE_MODES)}")
        self.cfg, self.mode, self.params = cfg, mode, cfg.key_params()
        self.cache_dir = Path(cache_dir) if cache_dir is not None and mode != "realtime" else None
        self.content_hash = False
        self.hits = self.misses = 0
        self._index: dict[str, str] | None = None
        if mode == "cache_only" and self.cache_dir is None:
            raise CacheError("frame source mode 'cache_only' needs a cache directory")
        if self.cache_dir is not None:
            stored = check_cache_config(self.cache_dir, cfg)
            if stored is None:
                if mode == "cache_only":
                    raise CacheError(f"{self.cache_dir} holds no frame cache ({CONFIG_FILE} missing); "
                                     "build one with `easyvideor1 cache --data FILE --out DIR`")
                log.warning("no frame cache in %s yet: every frame will be decoded", self.cache_dir)
                self.cache_dir = None
            else:
                self.content_hash = bool(stored.get("content_hash", False))

    def video(self, path: str, start: float | None = None, end: float | None = None) -> Frames:
        """Frames of the clip [start, end] seconds of the video at `path`."""
        return self._get("video", str(path), start, end)

    def image(self, path: str) -> Frames:
        """The image at `path` as [1, 3, H, W] uint8 frames."""
        return self._get("image", str(path), None, None)

    def frames_for_sample(self, sample: Sample) -> list[Frames]:
        """All media of a sample: its videos (clipped to `video_start`/`video_end`), then its images."""
        return ([self.video(v, sample.video_start, sample.video_end) for v in sample.videos]
                + [self.image(i) for i in sample.images])

    def _decode(self, kind: str, path: str, start: float | None, end: float | None) -> Frames:
        if kind == "video":
            return decode_video(path, self.cfg, start, end)
        return decode_image(path, self.cfg)

    def _get(self, kind: str, path: str, start: float | None, end: float | None) -> Frames:
        if self.cache_dir is None:
            return self._decode(kind, path, start, end)
        key = self._key(kind, path, start, end)
        entry = entry_path(self.cache_dir, key) if key else None
        if entry is not None and entry.exists():
            try:
                frames, _ = read_entry(entry, self.params)
                self.hits += 1
                return frames
            except CacheMismatchError:
                raise
            except CacheError as e:
                if self.mode == "cache_only":
                    raise
                log.warning("%s; decoding instead", e)
        self.misses += 1
        if self.mode == "cache_only":
            raise CacheError(f"no cache entry for {kind} {path} (start={start}, end={end}) in {self.cache_dir}: "
                             "the source is new or changed since the cache was built; rebuild it with "
                             "`easyvideor1 cache`, or use mode prefer_cache")
        return self._decode(kind, path, start, end)

    def _key(self, kind: str, path: str, start: float | None, end: float | None) -> str | None:
        try:
            source = source_identity(path, kind, self.content_hash)
        except (VideoDecodeError, ImageDecodeError):
            if self.mode != "cache_only":
                raise
            return self._lookup_index(kind, path, start, end)  # sources may stay behind
        return entry_key(kind, source, self.params, start, end)

    def _lookup_index(self, kind: str, path: str, start: float | None, end: float | None) -> str | None:
        if self._index is None:
            index_file = self.cache_dir / INDEX_FILE
            self._index = json.loads(index_file.read_text()) if index_file.exists() else {}
        return self._index.get(index_name(kind, path, start, end))
