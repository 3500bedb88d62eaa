"""YAML configs mapped onto dataclasses, strictly (DESIGN.md §4, inversefed's strictness).

Unknown keys raise :class:`ConfigError` listing the valid ones; ``key.sub=value`` overrides are
parsed as YAML scalars (``null`` is None; the string ``"None"`` is refused, a classic YAML trap).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

import yaml

from gi.errors import ConfigError

T = TypeVar("T")


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found; pass a path such as configs/demo.yaml")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    value = yaml.safe_load(raw) if raw != "" else ""
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set ``a.b.c=value`` into nested dicts (creating mappings as needed; validation happens later)."""
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for key in keys[:-1]:
            if node.get(key) is None:
                node[key] = {}
            if not isinstance(node[key], dict):
                raise ConfigError(f"override {text!r}: {key!r} is not a mapping")
            node = node[key]
        node[keys[-1]] = value
    return data


def _check_none_string(value: Any, where: str) -> None:
    if isinstance(value, str) and value in ("None", "none", "NULL", "Null"):
        raise ConfigError(f"{where}={value!r} is a string; write null (or ~) for no value")


def from_dict(cls: type[T], data: dict[str, Any] | None, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; nested dataclass fields recurse; unknown keys raise."""
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"unknown config key(s) {[prefix + k for k in unknown]}; valid keys"
                          f"{' of ' + where if where else ''}: {sorted(fields)}")
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        _check_none_string(value, key)
        target = hints.get(name)
        sub = _dataclass_in(target)
        if sub is not None and (value is None or isinstance(value, dict)):
            kwargs[name] = from_dict(sub, value, key) if value is not None else None
        else:
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"bad config for {where or cls.__name__}: {exc}") from None


def _dataclass_in(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def to_dict(obj: Any) -> Any:
    """Dataclass (nested) → plain YAML-able structures (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return obj
