"""The ``gi`` command: one entry point, a YAML config plus ``key=value`` overrides per subcommand."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence

from gi.core.config import load
from gi.core.devices import env_threads
from gi.core.errors import ConfigError, GIError, Stopped

EPILOG = """examples (each runs as written from the repository root, in seconds on a CPU; runs/demo-latest exists once
the first has run):
  gi run configs/demo.yaml                      end-to-end reconstruction of one CIFAR-10 sample: writes
                                                runs/demo-<YYYYmmdd-HHMMSS>, links runs/demo-latest to it
  gi run configs/demo.yaml labels.mode=truth    the same with oracle labels
  gi attack runs/demo-latest                    the label-first attack on the last demo run's capture (no truth)
  gi attack runs/demo-latest truth=runs/demo-latest   ... scored against the truth gi run saved
  gi labels configs/labels/demo.yaml            a label-recovery table (configs/labels/ holds the papers' tables)
  gi ablate configs/ablate/demo.yaml            label-knowledge ablation: one capture, one-hot vs recovered labels
  gi defend configs/defend/demo.yaml            defences x strengths: label/image leakage vs utility
  gi sweep configs/sweep/demo.yaml              a grid of gi run jobs, aggregated; re-run skips finished jobs
  gi bench configs/bench/demo.yaml              speed/quality benchmark as JSON (ms per iteration, PSNR, memory);
                                                kind: time-to-quality (ttq-*.yaml): PSNR vs seconds, vs breaching
                                                kind: suite (realistic.yaml): several bench configs, one table
  gi run configs/default.yaml --check           load and check a config (every key and type), run nothing
  gi methods                                    list the registered label-recovery methods

The full reproductions (the default job over 20 samples, the papers' tables, the defence study, sweeps over GPUs
and machines, benchmarks against breaching: minutes to hours): docs/usage.md#full-reproductions. With out=DIR,
gi ablate and gi defend resume an interrupted run (the same command again reuses finished rows).

A capture of your own model is rebuilt only by model=pkg.mod:fn (your factory; gi attack --help): a capture
file never imports or runs code on its own word (trust_factory=true runs the factory the file names: only for
files from a trusted source).
The default job is labels -> last-layer features -> the analytic inversion where the net allows it (fully
connected, or convs with invertible activations such as the DLG LeNet) -> gradient matching otherwise.
Every run writes one output directory (config.yaml, metrics.json, results.csv, PNG grid, plots, log); without
out= it is runs/<name>-<YYYYmmdd-HHMMSS>, and runs/<name>-latest links to the newest.
Overrides use dotted keys (attack.iterations=500); unknown keys are errors that list the valid keys."""


def _cmd_run(args: argparse.Namespace) -> int:
    from gi.experiments.config.run import RunConfig
    from gi.experiments.run import run

    cfg = load(RunConfig, args.config, args.overrides)
    if _checked(args):
        return 0
    _apply_threads()
    result = run(cfg)
    _print_summary(result.metrics)
    _notice_no_effect(args.overrides, result.reconstructions)
    _print_wrote(result.out, result.latest)
    out = shlex.quote(str(result.out))
    print(f"attack its capture: gi attack {out} truth={out}")
    return 0


def _notice_no_effect(overrides: list[str], reconstructions: list) -> None:
    """Name the ``attack.`` overrides that had no effect on this run (the analytic inversion answered every capture:
    :func:`gi.attack.stages.result.no_effect`), on stderr, so that a silent no-op is not mistaken for a result."""
    from gi.attack.stages.result import no_effect, no_effect_notice

    keys = [o.split("=", 1)[0].removeprefix("attack.") for o in overrides if o.startswith("attack.")]
    unused = no_effect(keys, reconstructions)
    if unused:
        print(no_effect_notice(unused), file=sys.stderr)


def _print_wrote(out: os.PathLike, latest: os.PathLike | None) -> None:
    """``wrote DIR``, and the ``<name>-latest`` link that names it too (gi.experiments.outdir.link_latest)."""
    print(f"wrote {out}" + (f" ({latest} links to it)" if latest is not None else ""))


def _checked(args: argparse.Namespace) -> bool:
    """``--check``: the config has loaded (the file, the overrides, every key and type checked; no torch): say so
    and stop before any work."""
    if args.check:
        print(f"gi {args.command}: the config loads ({args.config or 'defaults'}); --check runs nothing")
    return args.check


def _print_summary(m: dict) -> None:
    """The one-paragraph answer of gi run / gi attack: stages, then scores when there was truth."""
    stages = "  ".join(f"{s['name']} {s.get('method') or s.get('source') or s.get('optimizer')} {s['seconds']:.1f} s"
                       for s in m["stages"])
    print(f"stages: {stages}")
    if "psnr_mean" in m:
        over = f" over {m['num_images']} images" if m["num_images"] > 1 else ""
        print(f"PSNR mean {m['psnr_mean']:.2f} / median {m['psnr_median']:.2f} / min {m['psnr_min']:.2f} dB{over} "
              f"(mean colour {m['mean_colour_psnr_mean']:.2f}, random image {m['random_image_psnr_mean']:.2f} dB)  "
              f"SSIM {m['ssim_mean']:.3f}  "
              f"LPIPS-alex {m['lpips_alex_mean']:.3f}  labels {m['labels']['mode']}/{m['labels']['method']} "
              f"ins_acc {m['final_labels']['ins_acc']:.3f}")
    if "verdict" in m:
        from gi.analysis.verdict import verdict_line

        print(verdict_line(m["verdict"]))
    for warning in m.get("warnings", []):
        print(f"warning: {warning}")


def _cmd_attack(args: argparse.Namespace) -> int:
    from gi.experiments.attack import run_attack
    from gi.experiments.config.attack import load_attack_config

    cfg = load_attack_config(args.config, args.overrides)
    if args.check:  # and the files it names exist
        from gi.experiments.attack import capture_files

        capture_files(cfg.capture)
        if cfg.truth is not None:
            capture_files(cfg.truth, "truth")
    if _checked(args):
        return 0
    _apply_threads()
    result = run_attack(cfg)
    _print_summary(result.metrics)
    _notice_no_effect(args.overrides, result.outcome.reconstructions)
    _print_wrote(result.out, result.latest)
    return 0


def _cmd_labels(args: argparse.Namespace) -> int:
    from gi.experiments.config.labels import LabelBenchConfig
    from gi.experiments.labels import run_label_bench

    cfg = load(LabelBenchConfig, args.config, args.overrides)
    if _checked(args):
        return 0
    _apply_threads()
    out = run_label_bench(cfg)
    print(f"wrote {out}")
    return 0


def _cmd_ablate(args: argparse.Namespace) -> int:
    from gi.experiments.ablate import run_ablation
    from gi.experiments.config.ablate import AblateConfig

    cfg = load(AblateConfig, args.config, args.overrides)
    if _checked(args):
        return 0
    _apply_threads()
    out = run_ablation(cfg)
    print(f"wrote {out}")
    return 0


def _cmd_defend(args: argparse.Namespace) -> int:
    from gi.experiments.config.defend import DefendConfig
    from gi.experiments.defend import run_defend

    cfg = load(DefendConfig, args.config, args.overrides)
    if _checked(args):
        return 0
    _apply_threads()
    out = run_defend(cfg)
    print(f"wrote {out}")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from gi.experiments.config.sweep import SweepConfig
    from gi.experiments.sweep import run_sweep

    cfg = load(SweepConfig, args.config, args.overrides)
    if _checked(args):
        return 0
    if cfg.dry_run:
        from gi.experiments.sweep import dry_run

        print(dry_run(cfg, args.config, args.overrides))
        return 0
    _apply_threads()
    out = run_sweep(cfg)
    print(f"wrote {out}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from gi.experiments.bench import bench_kind
    from gi.experiments.config.bench import BenchConfig

    config, overrides = args.config, list(args.overrides)
    if config and "=" in config and not os.path.exists(config):  # `gi bench key=value ...` without a config
        config, overrides = None, [config] + overrides
    cfg = load(BenchConfig, config, overrides)
    kind = bench_kind(cfg)
    if _checked(args):
        return 0
    _apply_threads()
    path = kind.run(cfg)
    print(kind.format(path))
    print(f"wrote {path}")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    import labels
    from gi.core.names import label_options

    _apply_threads()

    for name, summary in labels.describe().items():
        options = label_options(name)
        taken = "any (passed on)" if options is None else ", ".join(options) or "none"
        print(f"{name:24s} {summary}\n{'':24s} options (labels.options): {taken}")
    return 0


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str, bool | str]] = {
    # name: (handler, help, takes a config: True, False, "optional" or the name of its positional argument)
    "run": (_cmd_run, "end-to-end reconstruction: data, victim, labels, images, scores", True),
    "attack": (_cmd_attack, "the label-first attack (labels, features, images) on a saved capture; scored with "
               "truth=FILE. A capture of your own model is rebuilt only by model=pkg.mod:fn (your factory), a "
               "factory registered in your code (gi.models.register_factory), or trust_factory=true, which imports "
               "and runs the code the file names: only for files from a trusted source", "capture"),
    "labels": (_cmd_labels, "label-recovery benchmark: a table (CSV/Markdown/JSON) and a plot", True),
    "ablate": (_cmd_ablate, "label-knowledge ablation: the same captures under every label mode and α/β variant", True),
    "defend": (_cmd_defend, "defences x strengths on one federation: label and image leakage, utility, ε; "
               "privacy-utility plots", True),
    "sweep": (_cmd_sweep, "many jobs (grid x seeds) across devices and machines, resumable, aggregated", True),
    "bench": (_cmd_bench, "time per iteration, final PSNR and peak memory of fixed reconstructions (JSON)",
              "optional"),
    "methods": (_cmd_methods, "list the registered label-recovery methods", False),
}


def command_examples(name: str) -> str:
    """The examples of :data:`EPILOG` for ``gi NAME``, with their descriptions: the epilog of ``gi NAME --help``."""
    lines, keep = [], False
    for line in EPILOG.split("\n\n", 1)[0].splitlines():
        if not line.startswith("  "):  # the heading
            continue
        if not line.startswith(" " * 4):  # an example; the lines indented further continue its description
            keep = line.split()[1] == name
        if keep:
            lines.append(line)
    return "examples (seconds on a CPU; full reproductions: docs/usage.md#full-reproductions):\n" + "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gi", description="Label-first gradient inversion for federated learning: recover labels, then "
        "features, then images, from what a client shares.", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details to the console")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch, the reconstruction included (sets $GI_THREADS; default: "
                        "$GI_THREADS, else torch's default, 1 for small models' reconstructions); 1 is fastest for "
                        "small models on a busy machine")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text, takes_config) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=textwrap.fill(help_text, 78),  # raw: wrapped here
                           epilog=command_examples(name), formatter_class=argparse.RawDescriptionHelpFormatter)
        if takes_config == "optional":
            p.add_argument("config", nargs="?", help="YAML config file (optional)")
            p.add_argument("overrides", nargs="*", help="key.sub=value overrides")
        elif isinstance(takes_config, str):
            p.add_argument("config", metavar=takes_config.upper(),
                           help=f"the {takes_config}: a .safetensors file or a gi run output directory "
                           "(runs/demo-latest: the newest demo run)")
            p.add_argument("overrides", nargs="*", help="key.sub=value overrides")
        elif takes_config:
            p.add_argument("config", help="YAML config file")
            p.add_argument("overrides", nargs="*", help="key.sub=value overrides")
        if takes_config:
            p.add_argument("--check", action="store_true",
                           help="load and check the config and overrides (every key and type), then stop: no work")
    return parser


def _export_threads(flag: int | None) -> None:
    """``--threads N`` becomes ``$GI_THREADS`` for the whole command (so the reconstruction reads it as the Python
    API does); a bad value of either is an error now."""
    if flag is not None:
        if flag < 1:
            raise ConfigError(f"--threads {flag}: give a positive number of CPU threads, e.g. --threads 1")
        os.environ["GI_THREADS"] = str(flag)
    env_threads()


def _apply_threads() -> None:
    """Set torch's CPU threads from ``$GI_THREADS``; called once the config has loaded (a config error answers
    without importing torch)."""
    threads = env_threads()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    logging.getLogger("gi").setLevel(logging.INFO)
    _stop_on_signals()
    try:
        _export_threads(args.threads)
        return COMMANDS[args.command][0](args)
    except GIError as exc:
        print(f"gi {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (Stopped, KeyboardInterrupt) as exc:
        stop = exc if isinstance(exc, Stopped) else Stopped(signal.SIGINT, "SIGINT")
        print(f"gi {args.command}: {stop}: finished results are kept and nothing half-written is left; the same "
              "command resumes where it resumes (gi ablate, gi defend, gi sweep skip what is done)", file=sys.stderr)
        return 128 + int(stop.signum)


def _stop_on_signals() -> None:
    """SIGTERM (a scheduler's preemption, ``kill``) and SIGINT (Ctrl-C) stop a command with a message and exit
    128 + the signal's number. Lightning's own handling would end a fit silently: on SIGTERM by raising
    ``SystemExit()`` (exit 0; Lightning calls the handler found at fit time after its own), on the
    ``KeyboardInterrupt`` of SIGINT with ``sys.exit(1)``; a :class:`Stopped` is neither, so Lightning re-raises it.
    A SIGINT the process was started to ignore (``nohup``, ``cmd &``) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum, signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, stop)


if __name__ == "__main__":
    sys.exit(main())
