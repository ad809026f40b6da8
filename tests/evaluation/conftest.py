"""Shared fixtures: write benchmark records in their own file formats into a temp folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def write_json(tmp_path: Path):
    """write_json(name, data) -> path: a JSON (or, for .jsonl, JSON-lines) file in tmp_path."""

    def write(name: str, data) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".jsonl"):
            path.write_text("".join(json.dumps(r) + "\n" for r in data), encoding="utf-8")
        else:
            path.write_text(json.dumps(data), encoding="utf-8")
        return path

    return write
