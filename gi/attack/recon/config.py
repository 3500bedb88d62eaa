"""Settings of one reconstruction (the ``attack`` section of a run config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gi.core.errors import ConfigError

SCHEDULES = ("multistep", "multistep-cycle", "constant", "cosine")
LABEL_KINDS = ("fixed", "joint")
BATCHINGS = ("auto", "vmap", "loop")
SMALL_MODEL = 2_000_000  # parameters under which one CPU thread and vmap-batched restarts are the defaults
BN_SOURCES = ("shared", "running", "update", "decoupled")
OUTPUT_ERRORS = ("simulated", "captured", "auto")
MAX_ALTERNATIVES = 4  # attack.alternatives: each one is a whole further fit of every optimised capture
MAX_ITERATIONS = 10_000_000  # attack.iterations: days of CPU for the smallest net; more is a typo, not a recipe
MAX_RESTARTS = 4096  # attack.restarts: every restart holds its own images and optimiser state in memory
# keys an alternative may not set: what the stages before the fit fixed for the base config (labels, f*, the
# analytic answers), where it runs and how it is packed, and the alternatives themselves
FIXED_ACROSS_ALTERNATIVES = ("alternatives", "preset", "labels", "feature_layer", "feature_draws", "analytic",
                             "analytic_tol", "device", "threads", "pack", "memory_budget", "batching", "compile",
                             "progress", "log_every")
# torch.compile's modes (attack.compile: true = "default"); "reduce-overhead" records CUDA graphs on a GPU
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_mode(value: bool | str, key: str = "attack.compile") -> str | None:
    """The torch.compile mode that a ``compile`` setting names: None for false, ``default`` for true, else the mode
    itself; a string that is not one of :data:`COMPILE_MODES` is a ConfigError naming ``key``."""
    if isinstance(value, str) and value not in COMPILE_MODES:
        raise ConfigError(f"{key}={value!r} is not a torch.compile mode; use true, false or one of "
                          f"{list(COMPILE_MODES)}")
    return ("default" if value is True else value) if value else None


# The ReconConfig keys only the optimisation reads: where the analytic inversion answers every capture they have
# no effect (gi.attack.stages.result.no_effect names them in a notice).
OPTIMISATION_KEYS = frozenset({
    "iterations", "lr", "optimizer", "objective", "regularizers", "layer_weights", "last_layer_weight",
    "feature_weight", "label_lr", "restarts", "cull_after", "init", "init_noise", "signed", "boxed", "schedule",
    "seed", "batching", "log_every", "compile", "pack", "memory_budget", "retries", "retry_ratio", "lbfgs_history",
    "aux_rank", "match_weight", "feature_relative", "feature_draws", "feature_refresh", "alternatives"})


@dataclass
class ReconConfig:
    """Inverting-Gradients defaults (frameworks.md §4) expressed in pixel space [0, 1].

    Matching objective (soft-label paper eq. 8)::

        L = Σ_{layers < N−1} w_l D(g_l, g_l*) + α D(g_{N−1}, g_{N−1}*) + β D(f_{N−1}(x), f*_{N−1}) + Σ_k λ_k R_k(x)

    ``objective`` names D (registry :data:`gi.attack.recon.objectives.OBJECTIVES`); ``layer_weights`` maps parameter
    names to w_l (missing names weigh 1, weight 0 drops a layer); ``last_layer_weight`` is α (multiplies the
    weights of ``fc.weight``/``fc.bias``); ``feature_weight`` is β (0: no feature term; the target f* comes
    from the label stage / ``fcn_analytic``); ``regularizers`` maps the names of the other objective terms
    (:data:`gi.attack.recon.terms.TERMS`, the image priors of :mod:`gi.attack.recon.regularizers`) to λ_k, e.g.
    ``{"tv": 1e-4}``.

    ``optimizer``: :data:`gi.attack.recon.optim.OPTIMIZERS` (``adam``, ``sgd``, ``lbfgs``: DLG's L-BFGS, per problem;
    ``signed`` applies to the first two). ``labels``: ``fixed`` (the given soft labels are the targets) or
    ``joint`` (DLG: per-image label logits are optimised with the images, initialised from the given labels or
    at random; ``label_lr`` is their step, null = ``lr``). ``init``: a name of
    :data:`gi.attack.recon.inits.INITS` (``analytic`` inverts the net with ``fcn_analytic.invert``: fully-connected
    nets and conv bodies with invertible activations;
    restarts after the first add ``init_noise``). ``restarts`` R are optimised as one batched problem and
    ranked by the objective only. ``cull_after`` k > 0 (with R > 1): successive halving in one step, after k
    iterations every capture keeps its restart with the lowest objective and only it runs the remaining
    ``iterations − k`` (R starts for the price of about one; 0: all restarts run to the end). ``batching``: how
    the P = N·R problems are simulated: ``vmap`` (one
    vectorised call; cheapest for small nets, e.g. R = 8 costs ~2× R = 1 on the DLG LeNet on CPU), ``loop`` (one
    call per problem, summed into one backward; for large conv nets on CPU, where vmap's batched double-backward
    of convolutions costs more than R separate calls), ``auto``: vmap on GPUs and for models under 2M
    parameters, loop otherwise.
    ``progress``: report progress while optimising: a bar on a terminal, a log line every 5 % of the
    iterations when stderr is piped or redirected (false: silent). ``preset``: the name of the
    :mod:`gi.attack.recon.presets` recipe the config was filled from (a record: explicit keys were applied over it by
    the
    config loader or :meth:`from_preset`). ``analytic_tol``: ``gi run`` / ``gi attack`` answer a capture with
    ``fcn_analytic.invert``'s image, skipping its optimisation, when the inversion's largest relative layer residual
    (gradient or forward) is below it; other captures are optimised from that image (0: always optimise), or
    from ``init`` when the residual is 0.3 or more (``gi.attack.stages.INIT_MAX_RESIDUAL``: rank-deficient).
    Default 1e-2: a clean capture inverts to ~1e-7 (fully connected) or 3e-6–8e-6 (the DLG LeNet, 95–112 dB on
    the cifar10-samples, docs/results/default-job.md); Gaussian noise of 1e-4 / 1e-3 of each gradient's std gives ~2e-3
    (50–56 dB) / ~2e-2 (27–36 dB), so captures above 1e-2 are worse than ~40 dB and are optimised.
    ``analytic``: false leaves ``fcn_analytic.invert`` out of ``gi run`` / ``gi attack`` altogether (no
    inversion, the optimisation alone from ``init``: the ablation of the analytic stage).
    ``threads``: torch CPU threads while reconstructing (null: ``$GI_THREADS`` if set, else 1 for models under
    2M parameters on CPU, else torch's default; oversubscribed CPUs run small-op loops 10–20× slower with more
    threads). ``bn_stats``: where the ``bn`` regulariser's targets come from (``shared``: batch statistics in
    ``capture.bn_stats`` when the threat model grants them, ``running``: the model's running statistics,
    DeepInversion's choice, ``update``: a one-step FedAvg update's buffers, :mod:`fcn_analytic.batchnorm`;
    ``decoupled``: the statistics of ``update``, and the simulated client's BatchNorm layers normalise with them,
    fixed, and back-propagate as in train mode, so the dummy images do not interact through the batch
    (:mod:`gi.attack.recon.batchnorm_decoupled`; docs/architecture.md, "BatchNorm in train mode"; captures whose
    buffers differ are then never packed into one problem).
    ``compile``: ``torch.compile`` the vectorised (``vmap``) objective: 1.6× faster
    steps for 20 packed LeNet captures on a CPU, after a first call that compiles for minutes
    (docs/results/throughput-gpu.md,
    "Throughput"); off by default. ``true`` is torch's ``default`` mode; a string names the mode
    (:data:`COMPILE_MODES`: ``reduce-overhead`` replays CUDA graphs of the step on a GPU).
    ``pack``: captures per packed problem in :func:`gi.attack.recon.reconstruct_many`
    (0: all of them in one problem; N > 0: problems of at most N captures, run one after another, which bounds
    the memory of a long ``data.images`` list on a GPU; ``auto``: as many as fit ``memory_budget`` GiB by the
    memory model of :mod:`gi.attack.recon.memory`, null budget: half the device's free memory; on a CUDA out-of-memory
    error an ``auto`` pack is halved and the problem run again). Every capture starts from the image its own seed
    gives it, so ``pack`` changes memory, speed and float rounding, as the thread count does; a long chaotic fit
    (L-BFGS over thousands of steps) can amplify that rounding into another answer (docs/architecture.md, "Packing").
    ``retries``: restart on a stall. After the fit, every capture whose best restart kept more than
    ``retry_ratio`` of its starting objective (:func:`gi.attack.recon.api.stalled`: the DLG plateau) is fitted again
    from ``restarts`` × 4^k new starts (seed ``seed`` + k for the k-th retry; culled no earlier than iteration
    100, with 100 L-BFGS pairs: :data:`gi.attack.recon.api.RETRY_MIN_CULL`), up to ``retries`` times; the fit with the
    lower objective is kept (never chosen with ground truth) and ``history['retries']`` records the retries it
    took, ``history['replaced']`` the fits a retry replaced (:func:`gi.attack.recon.api.replaced_record`). Callbacks
    see every fit. A fit from ``init=analytic`` is not retried (it starts near its optimum).
    ``lbfgs_history``: L-BFGS curvature pairs (None: sized by the problem,
    :func:`gi.attack.recon.optim.lbfgs_history`).
    ``output_error``: the output error ∂L/∂z the dummy gradients are simulated with. ``simulated``: the
    protocol's loss of the dummy logits and the slot labels (DLG and every paper). ``captured``: frozen at the one
    the capture shares, ``δ = ∇b`` of the last layer for one FedSGD sample (:func:`gi.world.losses.output_error_loss`,
    exact for any loss); the slot labels then only name the classes (report, features). ``auto``: ``captured``
    where the capture gives it (one FedSGD sample, last-layer bias), else ``simulated``.
    ``feature_layer``: where the feature term's f* sits. ``last``: the last layer's input (eq. 8). A module name
    (an ``nn.Linear``, e.g. ``body.1``, the first fully-connected layer after a conv body): that layer's
    per-sample inputs, from its own weight and bias gradients (:func:`gi.attack.recon.problem.layer_inputs`: one
    sample ``∇Wᵀ∇b/‖∇b‖²``; a FedSGD batch by SPEAR's sparsity sampling on the layer's input side), matched
    against the dummy images' input of that layer. ``aux_rank``: the principal directions of the attacker's aux
    images the ``aux-span`` prior keeps (:func:`gi.attack.recon.problem.aux_span`). ``feature_draws``: the budget
    of the sampling that looks for the inputs the named layer's vertex search missed
    (:func:`fcn_analytic.disaggregate.linear_inputs`; it stops as soon as every input is found; about 7000 draws per
    CPU second at B = 8, and an input with a fraction ρ of zeros needs about ρ^−(B−1)). ``match_weight`` scales the
    whole match term (0: none; the feature term and priors alone). ``feature_relative``: the feature term compares
    f/‖f*‖ with f*/‖f*‖ per capture (for ``l2``: ‖f − f*‖²/‖f*‖², free of the features' scale).
    ``feature_refresh``: every so many steps (0: never), where f* comes from a named layer's update over several
    local epochs (only approximate, :func:`gi.attack.recon.problem.drift_basis`), each slot's target is replaced
    by the direction of that layer's row space that best vanishes where the slot's current image's input does
    (:func:`fcn_analytic.disaggregate.null_directions`), at that input's norm.
    ``schedule``: the learning rate over the fit. ``multistep``: Inverting Gradients' ×0.1 at 3/8, 5/8 and 7/8 of
    ``iterations``; ``multistep-cycle``: the same steps within every ``feature_refresh`` period where the fit
    refreshes its targets (each refreshed target fitted from the full rate down), else ``multistep``;
    ``cosine``: cosine annealing to 0; ``constant``.
    ``alternatives``: up to :data:`MAX_ALTERNATIVES` mappings of keys of this section, each a further fit of every
    optimised capture with those keys over the base settings; per capture, the fit whose final relative gradient
    mismatch (:func:`gi.attack.recon.mismatch.shared_mismatch`, the attack's own signal, never the truth) is
    lowest is kept, and ``history["alternative"]`` says which (0: the base settings, k: the k-th alternative).
    The stages before the fit are not re-run, so an alternative cannot set the keys of
    :data:`FIXED_ACROSS_ALTERNATIVES`, nor turn on a feature term the base settings leave off.
    """

    iterations: int = 1000
    lr: float = 0.1
    optimizer: str = "adam"
    objective: str = "cosine"
    regularizers: dict[str, float] = field(default_factory=lambda: {"tv": 1e-4})
    layer_weights: dict[str, float] = field(default_factory=dict)
    last_layer_weight: float = 1.0
    feature_weight: float = 0.0
    labels: str = "fixed"
    label_lr: float | None = None
    restarts: int = 1
    cull_after: int = 0
    init: str = "uniform"
    init_noise: float = 0.1
    signed: bool = True
    boxed: bool = True
    schedule: str = "multistep"
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    bn_stats: str = "shared"
    batching: str = "auto"
    progress: bool = True
    log_every: int = 50
    compile: bool | str = False
    pack: int | str = 0
    memory_budget: float | None = None
    retries: int = 0
    retry_ratio: float = 1.0e-3
    lbfgs_history: int | None = None  # L-BFGS curvature pairs (None: gi.attack.recon.optim.lbfgs_history's rule)
    preset: str | None = None
    analytic: bool = True
    analytic_tol: float = 1.0e-2
    output_error: str = "simulated"
    feature_layer: str = "last"
    aux_rank: int = 200
    match_weight: float = 1.0
    feature_relative: bool = False
    feature_draws: int = 1_000_000
    feature_refresh: int = 0
    alternatives: list[dict[str, Any]] = field(default_factory=list)

    @property
    def decoupled_bn(self) -> bool:
        """Whether the simulated model normalises with the update's fixed batch statistics (``bn_stats:
        decoupled``, :mod:`gi.attack.recon.batchnorm_decoupled`)."""
        return self.bn_stats == "decoupled"

    @property
    def feature_layer_name(self) -> str | None:
        """The module whose input f* is: None for the last layer (``feature_layer: last``)."""
        return None if self.feature_layer == "last" else self.feature_layer

    @classmethod
    def from_preset(cls, name: str, **keys: object) -> ReconConfig:
        """The settings of preset ``name`` (:data:`gi.attack.recon.presets.PRESETS`) with ``keys`` over them."""
        from gi.attack.recon.presets import apply_preset

        return cls(**apply_preset({**keys, "preset": name}))

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu"):  # first, before the registries load torch: a missing GPU is refused
            from gi.core.devices import resolve_device  # in milliseconds (no torch import where /dev has no GPU)

            resolve_device(self.device)
        from gi.core.names import known  # the registries' names, without loading them (they import torch)

        regularizers = known("regularizer")
        checks = (("objective", self.objective, known("objective")), ("init", self.init, known("init")),
                  ("schedule", self.schedule, SCHEDULES), ("optimizer", self.optimizer, known("optimizer")),
                  ("labels", self.labels, LABEL_KINDS), ("bn_stats", self.bn_stats, BN_SOURCES),
                  ("batching", self.batching, BATCHINGS), ("output_error", self.output_error, OUTPUT_ERRORS))
        for key, value, allowed in checks:
            if value not in allowed:
                raise ConfigError(f"attack.{key}={value!r} is not allowed; valid: {sorted(allowed)}")
        if not isinstance(self.regularizers, dict):
            raise ConfigError(f"attack.regularizers must map names to weights, e.g. {{tv: 1e-4}}; valid names: "
                              f"{sorted(regularizers)}")
        for name in self.regularizers:
            if name not in regularizers:
                raise ConfigError(f"attack.regularizers has unknown {name!r}; valid: {sorted(regularizers)}")
        if self.output_error == "captured" and self.labels == "joint":
            raise ConfigError("attack.output_error=captured reads ∂L/∂z from the capture, so joint labels have "
                              "nothing to fit: use attack.labels=fixed, or attack.output_error=simulated (DLG)")
        compile_mode(self.compile)
        for key, value, most in (("iterations", self.iterations, MAX_ITERATIONS),
                                 ("restarts", self.restarts, MAX_RESTARTS)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ConfigError(f"attack.{key} must be an int in [1, {most}], got {value!r}")
        if self.cull_after < 0:
            raise ConfigError(f"attack.cull_after must be >= 0 (0: no culling), got {self.cull_after}")
        if self.lbfgs_history is not None and self.lbfgs_history < 1:
            raise ConfigError(f"attack.lbfgs_history must be >= 1 pairs (null: sized by the problem), got "
                              f"{self.lbfgs_history}")
        if self.retries < 0:
            raise ConfigError(f"attack.retries must be >= 0 (0: no restart on a stall), got {self.retries}")
        if not 0 < self.retry_ratio < 1:
            raise ConfigError(f"attack.retry_ratio must be in (0, 1): a fit stalled when its objective kept more "
                              f"than this fraction of its start; got {self.retry_ratio}")
        if self.pack != "auto" and (isinstance(self.pack, bool) or not isinstance(self.pack, int) or self.pack < 0):
            raise ConfigError(f"attack.pack must be auto or an int >= 0 (0: every capture in one problem; N: at most "
                              f"N captures per problem; auto: as many as fit attack.memory_budget), got {self.pack!r}")
        if self.memory_budget is not None and not self.memory_budget > 0:
            raise ConfigError(f"attack.memory_budget must be > 0 GiB (or null: half the device's free memory), got "
                              f"{self.memory_budget}")
        if self.lr <= 0 or (self.label_lr is not None and self.label_lr <= 0):
            raise ConfigError(f"attack.lr and attack.label_lr must be > 0, got {self.lr}, {self.label_lr}")
        if self.last_layer_weight < 0 or self.feature_weight < 0 or self.match_weight < 0:
            raise ConfigError("attack.last_layer_weight (α), attack.feature_weight (β) and attack.match_weight must "
                              "be >= 0")
        if self.match_weight == 0 and self.feature_weight == 0:
            raise ConfigError("attack.match_weight=0 and attack.feature_weight=0 leave nothing of the capture to "
                              "match: keep one of them > 0")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"attack.threads must be >= 1 or null, got {self.threads}")
        if self.log_every < 1:
            raise ConfigError(f"attack.log_every must be >= 1, got {self.log_every}")
        if self.preset is not None:
            from gi.attack.recon.presets import preset

            preset(self.preset)  # a ConfigError listing the presets
        if not isinstance(self.feature_layer, str) or not self.feature_layer:
            raise ConfigError(f"attack.feature_layer must be last or a module name (e.g. body.1), got "
                              f"{self.feature_layer!r}")
        if isinstance(self.feature_refresh, bool) or not isinstance(self.feature_refresh, int) or \
                self.feature_refresh < 0:
            raise ConfigError(f"attack.feature_refresh must be an int >= 0 (steps between refreshes of a "
                              f"multi-epoch round's feature targets; 0: never), got {self.feature_refresh!r}")
        if isinstance(self.feature_draws, bool) or not isinstance(self.feature_draws, int) or \
                not 1 <= self.feature_draws <= 100_000_000:
            raise ConfigError(f"attack.feature_draws must be an int in [1, 1e8] (draws of the named layer's input "
                              f"search, about 7000 per CPU second), got {self.feature_draws!r}")
        if isinstance(self.aux_rank, bool) or not isinstance(self.aux_rank, int) or self.aux_rank < 1:
            raise ConfigError(f"attack.aux_rank must be an int >= 1 (principal directions of the aux images kept by "
                              f"the aux-span prior), got {self.aux_rank!r}")
        if self.analytic_tol < 0:
            raise ConfigError(f"attack.analytic_tol must be >= 0, got {self.analytic_tol}")
        if self.init_noise < 0:
            raise ConfigError(f"attack.init_noise must be >= 0, got {self.init_noise}")
        self.check_alternatives()
        for key in ("regularizers", "layer_weights"):
            negative = {k: w for k, w in getattr(self, key).items() if w < 0}
            if negative:
                raise ConfigError(f"attack.{key} must hold weights >= 0, got {negative}")

    def check_alternatives(self) -> None:
        """ConfigErrors, at load, for ``alternatives`` that are not a list of at most :data:`MAX_ALTERNATIVES`
        non-empty mappings of this section's keys (other than :data:`FIXED_ACROSS_ALTERNATIVES`) whose values pass
        this section's own checks, or that turn on a feature term the base settings leave off."""
        if not isinstance(self.alternatives, list) or len(self.alternatives) > MAX_ALTERNATIVES:
            raise ConfigError(f"attack.alternatives must be a list of at most {MAX_ALTERNATIVES} mappings of attack "
                              f"keys (each a further fit of every capture), got {self.alternatives!r}")
        if not self.alternatives:
            return
        from gi.core.config import from_dict  # typed: a value of the wrong type is refused as in the base

        base = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k, alt in enumerate(self.alternatives):
            where = f"attack.alternatives[{k}]"
            if not isinstance(alt, dict) or not alt:
                raise ConfigError(f"{where} must be a non-empty mapping of attack keys, e.g. {{feature_relative: "
                                  f"true}}; got {alt!r}")
            unknown = sorted(set(alt) - set(base))
            fixed = sorted(set(alt) & set(FIXED_ACROSS_ALTERNATIVES))
            if unknown or fixed:
                raise ConfigError(f"{where}: " + (f"unknown attack key(s) {unknown}" if unknown else
                                                  f"{fixed} cannot vary between alternatives (the stages before "
                                                  f"the fit are run once, for the base settings)"))
            if self.feature_weight == 0 and alt.get("feature_weight", 0) > 0:
                raise ConfigError(f"{where} turns the feature term on, but the base settings leave it off "
                                  f"(feature_weight 0), so no per-slot f* is computed: set the base's feature_weight")
            try:
                from_dict(type(self), {**base, "alternatives": [], **alt}, where)
            except ConfigError as err:
                raise ConfigError(str(err) if str(err).startswith(where) else f"{where}: {err}") from None

    def alternative(self, k: int) -> ReconConfig:
        """The settings of fit ``k``: 0 the base settings, k ≥ 1 the k-th of ``alternatives`` over them."""
        if k == 0:
            return self
        return dataclasses.replace(self, alternatives=[], **self.alternatives[k - 1])
