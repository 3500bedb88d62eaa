"""The registry of ``gi bench`` kinds (docs/architecture.md "How to add", "A benchmark kind"): each kind's module
registers its runner here (``throughput``: :mod:`gi.experiments.bench`, ``time-to-quality``: :mod:`gi.experiments.ttq`,
``suite``: :mod:`gi.experiments.suite`), and :mod:`gi.experiments.bench`, the command, imports them all. Below
every kind, so that the suite runs the others without importing the command."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gi.core.registry import registrar


@dataclass(frozen=True)
class BenchKind:
    """A kind of benchmark (its config schema: :data:`gi.experiments.config.bench.BENCH_CONFIGS` under the same
    name): ``run(cfg)`` → the path it wrote, ``format(path)`` → the text ``gi bench`` prints; ``out_file``: the file
    name its ``out`` gets inside a folder (a suite member's) when the kind writes one file, None when ``out`` is a
    directory; ``check(cfg)``: what the run needs beyond its config (an optional package), a ConfigError before any
    work (a suite runs every member's before its first member)."""

    run: Callable[[Any], Path]
    format: Callable[[Path], str]
    out_file: str | None = None
    check: Callable[[Any], None] | None = None


BENCH_KINDS: dict[str, BenchKind] = {}


register_bench_kind = registrar(BENCH_KINDS, "bench kind")  # register_bench_kind(name)(BenchKind(...))


def bench_kind(cfg: Any) -> BenchKind:
    """The registered kind of a loaded bench config."""
    return BENCH_KINDS[cfg.kind]
