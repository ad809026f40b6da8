"""Loading dataclass trees from YAML plus dotted command-line overrides, validated at load.

Generic machinery only; the sections themselves live in `config.py` (and in the packages
that own them: `vision.config.VisionConfig`, `algorithms.config.AlgorithmConfig`).

- Unknown keys are errors that list the valid ones (with the closest match first).
- Values are converted to the field's annotated type (int, float, bool, str, lists,
  Optional, Literal); a value that does not fit is an error naming the dotted key.
- Field documentation is the string literal written under each field (cleanrl / EasyR1
  style); `field_docs` reads it back, so `--help-config` can list every field.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal, get_args, get_origin

import yaml

from easyvideor1.errors import UserError


class ConfigError(UserError, ValueError):
    """A config file or override that does not fit the config tree."""


def _convert(value: Any, tp: Any, key: str) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: cannot be {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v] if value else []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        return origin(_convert(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a section (mapping), got {value!r}")
        return from_dict(tp, value, prefix=key + ".")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            converted = tp(value) if not isinstance(value, str) else tp(float(value)) if tp is int else tp(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected {tp.__name__}, got {value!r}") from None
        if tp is int and float(value) != converted:
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return converted
    if tp is str:
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    return value


def _unknown(key: str, valid: list[str], prefix: str) -> ConfigError:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown config key {prefix}{key}{hint}; valid keys here: {', '.join(valid)}")


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested mapping; missing keys keep their defaults."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise _unknown(unknown[0], names, prefix)
    kwargs = {k: _convert(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:  # __post_init__ validation
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from None


def to_dict(obj: Any) -> dict[str, Any]:
    """The tree as plain nested dicts (YAML-safe)."""
    return dataclasses.asdict(obj)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` strings (values parsed as YAML scalars/lists) onto nested dicts."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        dotted, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({_first_line(e)})") from None
        node = data
        *parents, last = dotted.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p} is not a section")
        node[last] = value
    return data


def read_yaml(path: str) -> dict[str, Any]:
    """A YAML config file as nested dicts."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a valid YAML config ({_first_line(e)}); give a YAML file like those "
                          "in configs/") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def _first_line(error: Exception) -> str:
    """A parser error's first line (YAML errors span several, with a code excerpt)."""
    return " ".join(str(error).split("\n")[:2]).strip()


def load(cls: type, path: str | None = None, overrides: list[str] | None = None) -> Any:
    """Load `cls` from a YAML file (optional) plus dotted overrides."""
    data = read_yaml(path) if path else {}
    return from_dict(cls, apply_overrides(data, overrides or []))


def field_docs(cls: type) -> dict[str, str]:
    """The one-line docstring written under each field of dataclass `cls`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[node.target.id] = nxt.value.value.strip()
    return docs


def leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, type]]:
    """(dotted key, field, the dataclass that holds it) for every leaf field of the tree, depth first."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from leaves(tp, prefix + f.name + ".")
        else:
            yield prefix + f.name, f, cls


def describe(cls: type, prefix: str = "") -> list[str]:
    """Lines `dotted.key = default  # doc` for every field of the tree."""
    lines, docs = [], {}
    for key, f, owner in leaves(cls, prefix):
        doc = docs.setdefault(owner, field_docs(owner)).get(f.name, "")
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
        lines.append(f"{key} = {default!r}  # {doc}")
    return lines
