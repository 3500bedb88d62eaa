"""YAML configs mapped onto dataclasses, strictly and typed (docs/architecture.md, "Conventions").

* The one loader of every command's config (:func:`load`): the YAML file (or nothing), the dotted overrides, then
  the class's own ``from_mapping`` step (old spellings, presets, section defaults) or :func:`from_dict`.
* Loading (:func:`load_yaml`): UTF-8 only; YAML 1.2 floats (``1e-3`` is a float, PyYAML's YAML 1.1 would read a
  string); aliases may expand to at most :data:`MAX_NODES` nodes (a 481-byte file must not become a 20 MB
  config.yaml); a top-level ``defaults: [relative/path.yaml, ...]`` composes files: later files and then the
  including file override earlier ones, mappings merge deeply, cycles are errors.
* Overrides (:func:`apply_overrides`): ``key.sub=value``, the value parsed as one YAML 1.2 node (``null`` is None;
  the string ``"None"`` is refused, a classic YAML trap). Given the target dataclass, a dotted key stops splitting
  where a mapping cannot hold mappings, so ``grid.model.activation=[relu]`` sets ``grid["model.activation"]`` and
  ``attack.layer_weights.conv1.weight=0`` sets ``layer_weights["conv1.weight"]``; a field whose metadata has
  :data:`DOTTED_KEYS` ``n`` takes dotted keys after ``n`` plain ones (ablate's ``settings.NAME.protocol.lr``).
* Validation (:func:`from_dict`): unknown keys raise listing the valid ones; every value is checked against its
  field's type hint (int, float (an int is a float), bool, str, ``X | None``, lists, dicts, tuples, unions, nested
  dataclasses) before the dataclass is built and its ``__post_init__`` range checks run; one-line ConfigErrors
  ``key=value: expected TYPE, got TYPE``. Values are kept as written (an int stays an int in a float field).

Why a thin layer over pydantic's ``TypeAdapter(hint).validate_python(value, strict=True)`` per field, measured
(pydantic 2.14, jsonargparse 4.53, omegaconf 2.4, typeguard 4.6 on RunConfig, Python 3.11, 2 busy cores):

* omegaconf structured configs refuse a valid ``protocol.focal_alpha=[0.1, 2]`` ("Value '[0.1, 2]' of type
  'ListConfig' is incompatible with type hint 'Optional[Union[float, list[float]]]'": no unions of containers) and
  coerce instead of checking (``seed='5'`` → 5, ``name=5`` → '5', ``metrics.match='yes'`` → True).
* jsonargparse (Lightning's CLI) handles the unions, but also coerces (``seed: '5'`` → 5, ``match: 'yes'`` →
  True), its errors are multi-line ("Parser key "cfg.seed":\\n  Expected a <class 'int'>..."), an unknown key
  says "Group 'cfg' does not accept option 'attak'" without the valid ones, ``attack=5`` says "Unable to load config
  '5'", and import + building the RunConfig parser took 0.13 + 0.18 s (its ``instantiate_classes`` was deprecated
  in 4.49: API churn). It would replace the loader, the override syntax and the messages the CLI documents.
* pydantic strict on the whole dataclass refuses plain dicts ("Input should be an instance of RunConfig"), lax
  mode coerces; per field hint, strict mode is exactly the wanted semantics: 1.5 and true are not ints, 1 is a
  float, '1e-3' is not a float, unions with containers work, and its error ``loc``/``input`` name the bad item.
  Import 0.13-0.28 s in a fresh process; the first load of a RunConfig (adapters built) 0.08-0.10 s, later ones 5 ms.
* typeguard accepts ``True`` for ``int`` (bool is an int subclass) and words union errors on several lines.

The loader, the alias bound and ``defaults`` stay here (no library above bounds alias expansion).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

import yaml

from gi.core.errors import ConfigError

T = TypeVar("T")
MAX_NODES = 100_000  # YAML nodes a config may expand to through aliases (the largest shipped config has < 1000)
DOTTED_KEYS = "gi.dotted_keys"  # field metadata: after this many plain keys, the rest of a dotted key is one key

_FLOAT_1_2 = r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"  # 1e-3, 1.0e5: floats in YAML 1.2, not in 1.1


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader that also reads YAML 1.2 exponent floats (``1e-3``) as floats."""


class _Dumper(yaml.SafeDumper):
    """The matching dumper: a string that :class:`_Loader` would read as a float is quoted."""


for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_FLOAT_1_2),
                               list("-+0123456789"))


# ----------------------------------------------------------------------------- loading
def load(cls: type[T], path: str | Path | None, overrides: list[str] | None = None) -> T:
    """The config of type ``cls`` of every ``gi`` command (docs/usage.md, "Configs"): the YAML file ``path`` (with
    its ``defaults:``; None: an empty mapping), the dotted ``overrides`` (:func:`apply_overrides`), then
    ``cls.from_mapping`` when the class has its own loading step, else :func:`from_dict`. A class whose files name
    their own class (``gi bench``'s ``kind``) gives ``config_class(data, overrides)``, which picks it first."""
    data = load_yaml(path) if path is not None else {}
    overrides = list(overrides or [])
    pick = getattr(cls, "config_class", None)
    if pick is not None:
        cls = pick(data, overrides)
    data = apply_overrides(data, overrides, cls)
    make = getattr(cls, "from_mapping", None)
    return make(data) if make is not None else from_dict(cls, data)


def refuse_renamed(data: Any, renamed: dict[str, str], doc: str = 'docs/usage.md, "Configs"') -> None:
    """A one-line ConfigError for the first key of mapping ``data`` that ``renamed`` lists (old dotted key → its
    new spelling), naming the new one: an old spelling is refused, never read as if it were the new one."""
    for old, new in renamed.items():
        node: Any = data
        for key in old.split("."):
            node = node.get(key, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT:
            raise ConfigError(f"{old}={show(node, 40)}: renamed, write {new} instead (one spelling in every gi "
                              f"command, {doc})")


_ABSENT = object()


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping of config file ``path``, with its ``defaults`` files merged in (see the module docstring)."""
    return _load(Path(path), ())


def _load(path: Path, stack: tuple[Path, ...]) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} not found; pass a path such as configs/demo.yaml")
    here = path.resolve()
    if here in stack:
        raise ConfigError(f"defaults cycle: {' -> '.join(str(p) for p in stack + (here,))}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                          f"save it as UTF-8") from None
    data = parse_yaml(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    defaults = data.pop("defaults", [])
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise ConfigError(f"{path}: defaults={show(defaults)}: expected a list of config paths relative to the file")
    merged: dict[str, Any] = {}
    for name in defaults:
        target = path.parent / name
        if not target.is_file():
            raise ConfigError(f"{path}: defaults entry {name!r} not found ({target})")
        merged = merge(merged, _load(target, stack + (here,)))
    return merge(merged, data)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``over``; mappings present in both merge recursively, anything else is replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def parse_yaml(text: str, where: str) -> Any:
    """One YAML document with YAML 1.2 floats, aliases bounded by :data:`MAX_NODES` and expanded (not shared)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {}, set(), where)
        if size > MAX_NODES:
            raise ConfigError(f"{where} expands to {size} YAML nodes through aliases (limit {MAX_NODES}); "
                              f"write the values out or compose files with defaults: instead")
        return _unshared(loader.construct_document(node))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(f"{where} is nested too deeply") from None
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, memo: dict[int, int], active: set[int], where: str) -> int:
    """Nodes of the document with every alias written out (shared nodes counted once per use)."""
    key = id(node)
    if key in memo:
        return memo[key]
    if key in active:
        raise ConfigError(f"{where} has a recursive alias (a node that contains itself)")
    active.add(key)
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        children = []
    size = 1 + sum(_expanded_size(child, memo, active, where) for child in children)
    active.discard(key)
    memo[key] = size
    return size


def _unshared(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshared(v) for v in value]
    return value


def show(value: Any, limit: int | None = 80) -> str:
    """``value`` as one line of YAML flow style (how it is typed in an override), cut at ``limit`` characters."""
    try:
        text = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, width=1 << 30, allow_unicode=True)
        text = text.strip().removesuffix("...").strip()
    except yaml.YAMLError:
        text = repr(value)
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


# ----------------------------------------------------------------------------- overrides
def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    if not all(keys):
        raise ConfigError(f"override {text!r} must look like key.sub=value (an empty key part)")
    value = parse_yaml(raw, f"override {text!r}") if raw != "" else ""
    return keys, value


def format_override(key: str, value: Any) -> str:
    """The override text that :func:`parse_override` reads back as ``(key, value)``."""
    return f"{key}={show(value, limit=None)}"


def apply_overrides(data: dict[str, Any], overrides: list[str], cls: type | None = None) -> dict[str, Any]:
    """Set ``a.b.c=value`` into nested dicts (creating mappings as needed; validation happens in :func:`from_dict`).

    With ``cls`` (the dataclass ``data`` is for), dotted keys into mappings of non-mappings stay whole (module
    docstring)."""
    for text in overrides:
        keys, value = parse_override(text)
        set_dotted(data, keys, value, cls, f"override {text!r}")
    return data


def set_dotted(data: dict[str, Any], keys: list[str], value: Any, cls: Any = None, where: str = "") -> dict[str, Any]:
    """``data[k0][k1]... = value`` for the key parts ``keys`` of a config of type ``cls`` (see apply_overrides)."""
    node, tp, dotted = data, cls, None
    i = 0
    while True:
        rest = keys[i:]
        if len(rest) > 1 and (dotted == 0 or _is_flat_mapping(tp)):
            rest = [".".join(rest)]
        if len(rest) == 1:
            node[rest[0]] = value
            return data
        key = rest[0]
        tp, dotted = _child_type(tp, key, dotted)
        if node.get(key) is None:
            node[key] = {}
        if not isinstance(node[key], dict):
            raise ConfigError(f"{where or '.'.join(keys)}: {key!r} is not a mapping")
        node = node[key]
        i += 1


def _child_type(tp: Any, key: str, dotted: int | None) -> tuple[Any, int | None]:
    tp = _without_none(tp)
    if dataclasses.is_dataclass(tp):
        field = {f.name: f for f in dataclasses.fields(tp)}.get(key)
        if field is None:
            return None, None
        hint = _hints(tp)[key]
        return _dataclass_in(hint) or hint, field.metadata.get(DOTTED_KEYS)
    if typing.get_origin(tp) is dict:
        return typing.get_args(tp)[1], None if dotted is None else dotted - 1
    return None, None


def _is_flat_mapping(tp: Any) -> bool:
    """A ``dict[str, V]`` whose values cannot be mappings: the rest of a dotted key is one of its keys."""
    tp = _without_none(tp)
    return typing.get_origin(tp) is dict and not _can_be_mapping(typing.get_args(tp)[1])


def _can_be_mapping(tp: Any) -> bool:
    if tp is Any or tp is dict or dataclasses.is_dataclass(tp):
        return True
    if typing.get_origin(tp) in (dict, collections.abc.Mapping):
        return True
    return _is_union(tp) and any(_can_be_mapping(a) for a in typing.get_args(tp))


# ----------------------------------------------------------------------------- validation
def _check_none_string(value: Any, where: str) -> None:
    if isinstance(value, str) and value in ("None", "none", "NULL", "Null"):
        raise ConfigError(f"{where}={value!r} is a string; write null (or ~) for no value")


def from_dict(cls: type[T], data: dict[str, Any] | None, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; nested dataclass fields recurse; unknown keys and values of the wrong
    type raise one-line ConfigErrors before ``cls`` (and its ``__post_init__`` checks) is built."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}={show(data)}: expected a mapping of {cls.__name__} keys, got "
                          f"{type(data).__name__}")
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{where}." if where else ""
        moved = getattr(cls, "KEY_HINTS", {})  # keys a user may expect here, and the key that does their job
        hint = "".join(f"; {prefix}{k} is not a key here: {moved[k]}" for k in unknown if k in moved)
        raise ConfigError(f"unknown config key(s) {[prefix + str(k) for k in unknown]}{hint}; valid keys"
                          f"{' of ' + where if where else ''}: {sorted(fields)}")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        _check_none_string(value, key)
        sub = _dataclass_in(hints[name])
        if sub is not None and not (value is None and _allows_none(hints[name])):
            kwargs[name] = from_dict(sub, value, key)
        else:
            kwargs[name] = check_type(key, value, hints[name])
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"bad config for {where or cls.__name__}: {exc}") from None


def check_type(key: str, value: Any, hint: Any) -> Any:
    """``value`` if it is of type ``hint`` (strictly; an int is a float; a list is a tuple), else a ConfigError."""
    if hint is Any:
        return value
    if isinstance(value, list) and any(typing.get_origin(a) is tuple or a is tuple for a in _members(hint)):
        value = tuple(value)
    from pydantic import ValidationError

    try:
        _adapter(hint).validate_python(value, strict=True)
    except ValidationError as exc:
        _check_items(key, value, hint)  # names the bad entry of a dict or list, if one is
        raise ConfigError(_type_message(key, value, hint, exc.errors())) from None
    return value


def _check_items(key: str, value: Any, hint: Any) -> None:
    tp = _without_none(hint)
    args = typing.get_args(tp)
    if typing.get_origin(tp) is dict and isinstance(value, dict) and args:
        for k, v in value.items():
            check_type(f"{key} key {show(k)}", k, args[0])
            check_type(f"{key}.{k}", v, args[1])
    elif typing.get_origin(tp) is list and isinstance(value, list) and args:
        for i, v in enumerate(value):
            check_type(f"{key}[{i}]", v, args[0])


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    """Range check for ``__post_init__``: the one-line ConfigError ``key=value: expected ...`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={show(value)}: expected {expected}")


def _type_message(key: str, value: Any, hint: Any, errors: list[Any]) -> str:
    text = f"{key}={show(value)}: expected {type_name(hint)}, got {type(value).__name__}"
    inner = max(errors, key=lambda e: len(e["loc"]))["input"] if errors else value
    if inner is not value and not isinstance(inner, dict | list | tuple):
        text += f" (item {inner!r} is {type(inner).__name__})"
    return text


def type_name(hint: Any) -> str:
    if hint is type(None):
        return "None"
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "None")


@functools.cache
def _adapter(hint: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(hint)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _is_union(tp: Any) -> bool:
    return isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union


def _members(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if _is_union(tp) else (tp,)


def _allows_none(tp: Any) -> bool:
    return type(None) in _members(tp) or tp is Any


def _without_none(tp: Any) -> Any:
    members = [a for a in _members(tp) if a is not type(None)]
    return members[0] if len(members) == 1 else tp


def _dataclass_in(tp: Any) -> type | None:
    for arg in _members(tp):
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
