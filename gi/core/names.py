"""The names a config may give for things whose registries load torch (zoo models, label methods, the attack's
objectives, inits, optimisers and regularisers), so that a config naming an unknown one fails when it loads, in
one line, without importing torch (docs/architecture.md "Conventions", configs).

The registries stay the truth: each static list here is that of one registry (:data:`REGISTRIES`; e.g.
:data:`ZOO_MODELS` of :data:`gi.world.bodies.BODIES`, :data:`LABEL_METHODS` of :data:`labels.METHODS`), and a
test checks every pair is equal. A name added to a
registry at run time (a user's label method, a body added to ``BODIES``) is known as well: its registry's module
is then loaded, and :func:`known` reads it from ``sys.modules``, never importing it.

:data:`DATASET_SIZES` gives the image count of each dataset split of fixed size (``data.images: all`` is counted
from it at config load); a test checks it against the datasets read.

The label metrics' names (:data:`LABEL_METRICS`, :data:`POOLED_METRICS`) live here too; :mod:`gi.analysis.metrics`
re-exports them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from gi.core.errors import ConfigError

# the image count of every (dataset, split) of gi.world.data.DATASETS whose size is fixed (a user's folder has none):
# `data.images: all` is sized from it when the config loads, before any data is read
DATASET_SIZES: dict[tuple[str, str], int] = {
    **{(f"{s}-samples", "test"): 20 for s in ("cifar10", "cifar100", "mnist", "fashion-mnist", "imagenet")},
    ("fashion-mnist", "train"): 60000, ("fashion-mnist", "test"): 10000, ("mnist", "train"): 60000,
    ("mnist", "test"): 10000, ("cifar10", "train"): 50000, ("cifar10", "test"): 10000, ("cifar100", "train"): 50000,
    ("cifar100", "test"): 10000, ("svhn", "train"): 73257, ("svhn", "test"): 26032, ("svhn", "extra"): 531131,
}

# gi.world.bodies.BODIES
ZOO_MODELS = ("cnn", "cnn6", "convnet", "fcn3", "fcn4", "lenet", "lenet5", "linear", "mlp", "resnet18", "resnet32",
              "resnet50", "vgg16")

# labels.METHODS (every module of labels/ registers its own)
LABEL_METHODS = ("auto", "checked", "decaf", "decaf-paper", "dist-aux-bias-grad", "dist-aux-weight-grad", "dist-exact",
                 "dist-init-bias", "dist-soft-label", "dist-soft-label-path", "fc-inputs", "idlg", "idlg-batch", "ilrg",
                 "ilrg-robust", "ilrg-update", "llg", "llg*", "llg+", "llg+-update", "posterior", "rlg", "rlu",
                 "soft-lambda", "uniform-guess", "yin", "zlg", "zlg+", "zlg+-update")

# the keyword options of every method of labels.METHODS (its function's parameters but capture(s) and aux; None:
# the method takes **options and passes them on, so they are checked where they land, by labels.recover)
LABEL_OPTIONS: dict[str, tuple[str, ...] | None] = {
    "auto": (), "checked": ("base", "moves", "options", "steps"),
    "decaf": ("calibrator", "dtype", "epochs", "min_count", "null_removal", "null_test", "solver", "step", "threshold"),
    "decaf-paper": ("epochs", "step", "threshold"), "dist-aux-bias-grad": ("aux_steps", "normalize", "solver"),
    "dist-aux-weight-grad": ("aux_steps", "include_bias", "normalize"), "dist-exact": ("strict",),
    "dist-init-bias": ("normalize",), "dist-soft-label": ("aux_steps", "normalize", "solver"),
    "dist-soft-label-path": ("normalize", "points", "solver"), "fc-inputs": ("draws", "layer", "programs"), "idlg": (),
    "idlg-batch": (),
    "ilrg": ("iterations", "probs", "robust"), "ilrg-robust": ("iterations", "probs"), "ilrg-update": None,
    "llg": (), "llg*": ("dtype", "dummy", "seed"), "llg+": ("dtype",), "llg+-update": None,
    "posterior": ("dtype", "missing", "weighting"), "rlg": ("rtol",),
    "rlu": ("dtype", "iterations", "move", "samples", "search", "seed", "solver"),
    "soft-lambda": ("accept", "bound", "candidates", "grid_step", "kind", "lbfgs", "pso", "ratio", "route", "seed",
                    "stages", "threshold"),
    "uniform-guess": (), "yin": (), "zlg": ("dtype", "dummy", "seed"), "zlg+": ("dtype", "prob"), "zlg+-update": None}

# the attack's registries (gi.attack.recon): attack.objective, attack.init, attack.optimizer, attack.regularizers
ATTACK_OBJECTIVES = ("cosine", "cosine-layerwise", "l1", "l2")  # gi.attack.recon.objectives.OBJECTIVES
ATTACK_INITS = ("analytic", "aux-mean", "constant", "gaussian", "uniform")  # gi.attack.recon.inits.INITS
ATTACK_OPTIMIZERS = ("adam", "lbfgs", "sgd")  # gi.attack.recon.optim.OPTIMIZERS
# gi.attack.recon.terms.REGULARIZERS
ATTACK_REGULARIZERS = ("aux-span", "bn", "l2", "l2-norm", "tv", "tv-iso", "tv-kornia")

# gi.experiments.ttq's tables: a time-to-quality config's clock and contenders
TTQ_CLOCKS = ("cpu", "wall")  # gi.experiments.ttq.CLOCKS
TTQ_CONTENDERS = ("breaching", "gi")  # gi.experiments.ttq.CONTENDERS

# gi.world.aux_shift.AUX_SHIFTS: aux.shift, the aux set's distribution shifts
AUX_SHIFTS = ("blur", "contrast", "noise")

# per-trial label metrics of gi.analysis.metrics.label_metrics_from_counts
LABEL_METRICS = ("ok", "cls_acc", "ins_acc", "count_acc", "prop_mse", "prop_kl", "l1", "l2", "linf", "absent_hit",
                 "absent_called", "absent_true", "soft_l1", "top1")
# metrics pooled over trials (Σ numerator / Σ denominator of per-trial counts), not averaged: the precision and
# recall of "class absent" decisions (a class is called absent when its predicted proportion is 0)
POOLED_METRICS = {"absent_precision": ("absent_hit", "absent_called"), "absent_recall": ("absent_hit", "absent_true")}

# kind: (static names, the registry's module, its table)
REGISTRIES = {"model": (ZOO_MODELS, "gi.world.bodies", "BODIES"),
              "label method": (LABEL_METHODS, "labels.base", "METHODS"),
              "objective": (ATTACK_OBJECTIVES, "gi.attack.recon.objectives", "OBJECTIVES"),
              "init": (ATTACK_INITS, "gi.attack.recon.inits", "INITS"),
              "optimizer": (ATTACK_OPTIMIZERS, "gi.attack.recon.optim", "OPTIMIZERS"),
              "regularizer": (ATTACK_REGULARIZERS, "gi.attack.recon.terms", "REGULARIZERS"),
              "aux shift": (AUX_SHIFTS, "gi.world.aux_shift", "AUX_SHIFTS"),
              "ttq clock": (TTQ_CLOCKS, "gi.experiments.ttq", "CLOCKS"),
              "ttq contender": (TTQ_CONTENDERS, "gi.experiments.ttq", "CONTENDERS")}


def known(kind: str) -> list[str]:
    """The names of ``kind`` (a key of :data:`REGISTRIES`): the static list and, when its registry's module is
    loaded, the registry's names (those registered at run time included), sorted."""
    static, module, table = REGISTRIES[kind]
    live = getattr(sys.modules.get(module), table, None) or {}
    return sorted({*static, *live})


def label_options(method: str) -> tuple[str, ...] | None:
    """The option names label method ``method`` takes (:data:`LABEL_OPTIONS`; a method registered at run time: its
    function's parameters, read from the loaded registry; None: any, passed on by the method)."""
    if method in LABEL_OPTIONS:
        return LABEL_OPTIONS[method]
    fn = getattr(sys.modules.get("labels.base"), "METHODS", {}).get(method)
    if fn is None:
        return None
    import inspect

    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return tuple(sorted(n for n in params if n not in ("capture", "captures", "aux")))


def _check_checked(options: dict, key: str) -> None:
    """``checked``'s own options: ``base`` a label method other than ``checked``, ``options`` its options."""
    inner = options.get("base", "auto")
    if inner == "checked":
        raise ConfigError(f"{key}=checked: its base cannot be checked itself; name the method whose counts to check")
    check_label_call(inner, options.get("options", {}) if options.get("options") is not None else {},
                     f"{key}=checked, base")


# label methods whose options name another method (checked when the config loads, like the method's own name)
LABEL_OPTION_CHECKS = {"checked": _check_checked}


def check_label_call(method: object, options: object, key: str) -> None:
    """A one-line :class:`ConfigError` unless ``method`` is a known label method and ``options`` a mapping of the
    options it takes (:func:`label_options`); ``key`` names the config key of the method (``labels.method``), the
    options' key is that of the error. The check ``labels.recover`` makes, made when a config loads."""
    check_name("label method", method, key)
    if not isinstance(options, dict):
        raise ConfigError(f"{key} options={options!r}: expected a mapping of option names to values")
    valid = label_options(str(method))
    unknown = sorted(set(options) - set(valid)) if valid is not None else []
    if unknown:
        raise ConfigError(f"{key}={method!r} takes no option(s) {unknown}; valid: {sorted(valid or ())}")
    if method in LABEL_OPTION_CHECKS:
        LABEL_OPTION_CHECKS[str(method)](options, key)


def check_name(kind: str, name: object, key: str, also: Iterable[str] = ()) -> None:
    """A :class:`ConfigError` naming ``key``, the value and the valid names unless ``name`` is a known ``kind``
    (:func:`known`) or one of ``also`` (e.g. a table's own variants)."""
    also = list(also)
    if isinstance(name, str) and (name in also or name in known(kind)):
        return
    extra = f" or one of {sorted(also)}" if also else ""
    raise ConfigError(f"{key}={name!r}: unknown {kind}; valid: {known(kind)}{extra}")
