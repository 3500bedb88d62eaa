"""The config schema of ``gi bench``'s ``suite`` kind (:class:`SuiteConfig`, :class:`SuiteMember`): several bench
configs run one after another as one command; the runner is :mod:`gi.experiments.suite`.

A member's ``config`` path is read the way a time-to-quality config's ``job:`` is: handed unchanged to
:func:`gi.core.config.load`, so a relative path is relative to the current directory (the repository root, where
``gi`` is run and where every shipped config's paths start)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gi.core.config import from_dict, load, load_yaml, parse_override, require
from gi.core.errors import ConfigError
from gi.experiments.config.bench import BenchConfig
from gi.experiments.outdir import check_run_name

LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")  # a member's label names its folder in the suite's output
SET_BY_SUITE = ("out", "overwrite")  # member keys the suite sets itself (its output goes to <suite out>/<label>/)


@dataclass
class SuiteMember:
    """One member of a suite: a ``gi bench`` config file (``config``, relative to the current directory) and its
    ``overrides`` (``key=value``, as on the command line)."""

    config: str = ""
    overrides: list[str] = field(default_factory=list)


@dataclass
class SuiteConfig:
    """``kind: suite``. ``members``: {label: {config: PATH, overrides: [key=value, ...]}}, run in this order, each
    through its own kind's runner, its output in ``<out>/<label>/``; ``only``: run just these labels (null: all);
    ``out``: the suite's output directory (default ``runs/bench/<name>-<stamp>``)."""

    kind: str = "suite"
    KEY_HINTS: ClassVar[dict[str, str]] = {"seed": "each member's seed is in its overrides "
                                                   "(members.LABEL.overrides)"}
    name: str = "suite"
    members: dict[str, SuiteMember] = field(default_factory=dict)
    only: list[str] | None = None
    out: str | None = None
    overwrite: bool = False

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> SuiteConfig:
        """The loading step of :func:`gi.core.config.load` (``gi bench``): the suite, then every member loaded with
        its overrides now (no torch, :meth:`member_configs`), so that a bad member is refused before any work."""
        if isinstance(data, dict) and isinstance(data.get("members"), dict):
            data = {**data, "members": {label: from_dict(SuiteMember, member, f"members.{label}")
                                        for label, member in data["members"].items()}}
        cfg = from_dict(cls, data)
        cfg.member_configs()
        return cfg

    def __post_init__(self) -> None:
        check_run_name(self.name)
        require(self.kind == "suite", "kind", self.kind, "suite")
        require(bool(self.members), "members", self.members,
                "at least one member {label: {config: PATH, overrides: [key=value, ...]}}")
        bad = [label for label in self.members if not LABEL.match(label)]
        if bad:
            raise ConfigError(f"members has label(s) {bad}: a label names the member's output folder; use letters, "
                              "digits, '-' and '_' (starting with a letter or digit), e.g. s1")
        require(self.only is None or bool(self.only), "only", self.only,
                "a non-empty list of member labels (null: all)")
        unknown = [label for label in self.only or [] if label not in self.members]
        if unknown:
            raise ConfigError(f"only names unknown member(s) {unknown}; valid: {list(self.members)}")
        for label, member in self.members.items():
            require(bool(member.config), f"members.{label}.config", member.config,
                    "the path of a gi bench config file, e.g. configs/bench/realistic-s1.yaml")
            for text in member.overrides:
                keys, _ = parse_override(text)
                if keys[0] in SET_BY_SUITE:
                    raise ConfigError(f"members.{label}.overrides has {text!r}: the suite writes each member's "
                                      f"output to <suite out>/{label}/; set out= and overwrite= on the suite")

    def selected(self) -> list[str]:
        """The labels to run, in the order of ``members``."""
        return [label for label in self.members if self.only is None or label in self.only]

    def member_configs(self) -> dict[str, Any]:
        """Every member's bench config (all members, ``only`` or not), loaded from its file with its overrides; a
        missing file, a bad key or value, a nested suite or a kind without an ``out`` key is a ConfigError naming
        the member."""
        from gi.experiments.bench import BENCH_KINDS  # the registry of kinds (it imports the bench schema)

        out = {}
        for label, member in self.members.items():
            where = f"members.{label} (config={member.config!r}, overrides={member.overrides})"
            try:
                cls = BenchConfig.config_class(load_yaml(member.config), list(member.overrides))
                if cls is SuiteConfig:
                    raise ConfigError("a suite cannot be a member of a suite; list its members here instead")
                cfg = load(BenchConfig, member.config, member.overrides)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            if not _has_out(type(cfg)):
                raise ConfigError(f"{where}: kind {getattr(cfg, 'kind', '?')!r} has no out/overwrite keys, so the "
                                  f"suite cannot put its output in <suite out>/{label}/; kinds with them: "
                                  f"{sorted(k for k, v in BENCH_KINDS.items() if _has_out(v.config()))}")
            out[label] = cfg
        return out


def _has_out(cls: type) -> bool:
    """Whether bench config class ``cls`` has the keys the suite sets (:data:`SET_BY_SUITE`)."""
    return set(SET_BY_SUITE) <= {f.name for f in dataclasses.fields(cls)}
