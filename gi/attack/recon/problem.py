"""The plan before the loop: :func:`build_problem` turns captures, label results and a config into a
:class:`Problem`, everything the optimisation needs, without Lightning (docs/architecture.md, "Public contract").

N captures of one global model are one problem of N rows (times the config's R restarts in the optimiser): the
shared tensors to match stacked over the captures, the slot labels, the feature targets of eq. 8, the analytic
image prior, the BatchNorm targets the threat model grants, the weighted objective terms and whether the
N·R rows are simulated in one ``vmap`` call. Ground truth never enters a Problem.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from gi.attack.recon.batchnorm_decoupled import decoupled_model
from gi.attack.recon.config import SMALL_MODEL, ReconConfig
from gi.attack.recon.terms import term_weights
from gi.capture import Capture
from gi.core.devices import resolve_device
from gi.core.errors import CaptureError, ConfigError, GIError
from gi.core.lru import LRU, digest
from gi.label_result import LabelResult
from gi.world.fl.local import distinct_samples
from gi.world.fl.protocol import Protocol
from labels.slot_check import slot_targets

if TYPE_CHECKING:
    from fcn_analytic.disaggregate import SummedLayer

Tensor = torch.Tensor


@dataclass
class Problem:
    """What the attack optimises against: the model and protocol, the shared message of N captures, their labels
    and priors, and the plan (terms, batching). Never truth.

    ``targets``: {name: (N, *shape)} every shared tensor (gradients or update); ``weights``: w_l per name (0 drops
    a layer, see :func:`match_weights`); ``soft`` (N, B, C): the slot labels, fixed targets or the start of joint
    labels (None: joint labels from a random start); ``features`` (N, B, D): f* of eq. 8 (needed by the
    ``features`` term); ``prior`` (N, B, C, H, W): the image estimate of ``init=analytic``; ``bn_targets``
    {module: (mean, var)} for the ``bn`` term; ``output_error`` (N, B, C): the captured ∂L/∂z the dummy gradients
    are simulated with (:func:`output_errors`; None: simulated from ``soft``); ``kind``: the simulator
    (``gradient`` or ``update``); ``terms``: {term: weight} of the objective, summed in this order
    (:mod:`gi.attack.recon.terms`); ``batching``: ``vmap`` (all rows in one vectorised call) or ``loop`` (one row at a
    time); ``ids``: the positions of the N captures in the list given to :func:`gi.attack.recon.reconstruct_many` (a
    pack
    chunk or a retry holds some of them; callbacks follow the captures across problems by them; empty: 0 … N−1).
    ``feature_basis``: per capture, the row space of the feature layer's update over several local epochs
    (:func:`drift_basis`), against which ``attack.feature_refresh`` refreshes the feature targets; None without.
    """

    model: torch.nn.Module
    protocol: Protocol
    targets: dict[str, Tensor]
    weights: dict[str, float]
    soft: Tensor | None
    image_shape: tuple[int, ...]
    num_samples: int
    terms: dict[str, float]
    batching: str
    kind: str = "gradient"
    history: dict[str, Tensor] = field(default_factory=dict)
    features: Tensor | None = None
    prior: Tensor | None = None
    bn_targets: dict[str, tuple[Tensor, Tensor]] | None = None
    ids: tuple[int, ...] = ()
    output_error: Tensor | None = None
    notes: tuple[str, ...] = ()
    feature_layer: str | None = None
    aux_span: tuple[Tensor, Tensor] | None = None
    feature_basis: tuple[Tensor, ...] | None = None

    def __post_init__(self) -> None:
        if "features" in self.terms and self.features is None:
            raise ConfigError("attack.feature_weight > 0 needs last-layer feature targets f* (eq. 8): recover them "
                              "(labels.method=soft-lambda, or a last-layer bias) or set feature_weight=0")

    @property
    def num_problems(self) -> int:
        """N, the captures."""
        return next(iter(self.targets.values())).shape[0]

    @property
    def capture_ids(self) -> tuple[int, ...]:
        """:attr:`ids`, or 0 … N−1 when not set."""
        return self.ids or tuple(range(self.num_problems))

    @property
    def matched(self) -> list[str]:
        """The shared tensors the ``match`` term compares (weight ≠ 0), in the capture's order."""
        return [k for k in self.targets if self.weights[k] != 0.0]


def match_weights(names: list[str], cfg: ReconConfig, last_layer: str = "fc") -> dict[str, float]:
    """w_l per shared tensor: ``layer_weights`` (default 1) times α for the last layer ``last_layer`` (eq. 8), all
    times ``match_weight`` (0: no match term)."""
    last = (f"{last_layer}.weight", f"{last_layer}.bias")
    return {k: float(cfg.layer_weights.get(k, 1.0)) * (cfg.last_layer_weight if k in last else 1.0) * cfg.match_weight
            for k in names}


def choose_batching(batching: str, rows: int, model: torch.nn.Module, accelerator: str) -> str:
    """``attack.batching`` resolved: ``auto`` is ``vmap`` for several rows on a GPU or of a model under
    :data:`SMALL_MODEL` parameters, else ``loop`` (one row: plain autograd has the least overhead)."""
    if batching != "auto":
        return batching
    small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL
    return "vmap" if rows > 1 and (accelerator == "gpu" or small) else "loop"


def image_slots(capture: Capture) -> int:
    """The number of images a reconstruction of ``capture`` has: its samples, or for an update the samples the
    client's local steps touch (:func:`gi.world.fl.local.distinct_samples`; 1 step of 8 over N_k = 66 depends on 8)."""
    return distinct_samples(capture.protocol, capture.num_samples) if capture.is_update else capture.num_samples


def labels_for_slots(label_result: LabelResult | None, batch: int, num_classes: int) -> Tensor:
    """Soft targets (B, C) from a LabelResult: its soft labels, else one one-hot slot per counted label.

    The order of slots is irrelevant to a mean loss (and the batch metric matches images one-to-one), so slots
    are put in a canonical order: by class (argmax), stably. Counts fill slots class by class in increasing
    class index; an oracle's per-sample labels land in the same order, so exact counts give identical slots.
    """
    if label_result is None:
        raise ConfigError("reconstruct needs labels: pass a LabelResult (labels.recover, or oracle labels made by "
                          "the pipeline), or optimise them from a random start: labels.mode=joint in a gi run "
                          "config, ReconConfig(labels='joint') in Python")
    soft = label_result.soft
    if soft is not None and soft.shape == (batch, num_classes):
        soft = soft.float()
        return soft[torch.argsort(soft.argmax(1), stable=True)]
    counts = label_result.counts.long()
    if int(counts.sum()) != batch:
        reason = label_result.info.get("reason") if not label_result.ok else None
        raise ConfigError(f"label counts of {label_result.method!r} sum to {int(counts.sum())} but the capture has "
                          f"{batch} samples" + (f" (the method failed: {reason})" if reason else ""))
    return slot_targets(counts).float()


def feature_targets(capture: Capture, label_result: LabelResult | None, soft: Tensor | None,
                    layer: str | None = None, seed: int = 0, draws: int = 1_000_000,
                    per_slot: bool = True) -> Tensor | None:
    """f*_{N−1} per slot (B, D), float64, for the feature term of eq. 8; None when the capture does not give it.
    ``layer`` (``attack.feature_layer``) other than the last layer: :func:`layer_inputs` of that layer instead.

    One sample: :func:`fcn_analytic.last_layer_features` (``λ·g_r`` of the soft-label method, ``∇Wᵀ∇b/‖∇b‖²``
    with a bias, or λ fitted to the slot label). A FedSGD batch of B ≤ C − 1 samples under the cross-entropy loss:
    each slot's own feature from the slot labels (:func:`slot_features`). Otherwise, a batch with a last-layer
    bias: slot with label c gets ``∇W_c/∇b_c``, the ∇b-weighted mean of the features in the batch (breaching's
    ``features`` regulariser), that class's feature only where the net is confident; a bias-free batch has none.
    ``soft`` None (no labels: joint labels from a random start): only the label-free bias source of one sample.
    ``per_slot`` False skips the per-slot solve (the class means only: a record of f* that no term matches).
    """
    layer = resolve_feature_layer(capture, layer)
    if layer is not None and layer != capture.last_layer_name:
        return layer_inputs(capture, layer, soft, seed, draws)
    b = capture.num_samples if soft is None else soft.shape[0]
    if capture.is_update or (soft is None and b != 1):
        return None
    if b == 1:
        from fcn_analytic import last_layer_features

        if soft is None:
            label_result = None  # the bias source or nothing: a λ fit needs a label
        elif label_result is None or (label_result.features is None and label_result.soft is None):
            # counts only (or joint labels): λ fitted to the slot label
            label_result = LabelResult.from_counts("slots", soft.argmax(1).bincount(minlength=soft.shape[1]),
                                                   soft=soft)
        try:
            return last_layer_features(capture, label_result).reshape(1, -1)
        except GIError:
            return None
    exact = slot_features(capture, soft, seed) if per_slot else None
    if exact is not None:
        return exact
    gw, gb = capture.last_layer(torch.float64)
    if gb is None:
        return None
    cls = soft.argmax(1)
    denom = gb[cls]
    if bool((denom == 0).any()):
        return None
    return gw[cls] / denom.unsqueeze(1)


SLOT_FIT = 1e-4  # slot_features: the largest relative gradient mismatch of features that are kept
_SLOTS = LRU(64)  # slot_features per gradient and labels (sha1)


def slot_features(capture: Capture, soft: Tensor, seed: int = 0) -> Tensor | None:
    """Each slot's own last-layer input (B, D), float64, from the last layer's gradient and the slot labels
    ``soft`` (B, C): :func:`fcn_analytic.disaggregate.slot_inputs` (soft-label paper eq. 2 for a batch, solved for
    every sample, a softmax temperature included). None where it does not apply (an update, one sample, a loss
    other than cross-entropy, B ≥ C, a rank-deficient gradient) or where the answer leaves a relative gradient
    mismatch above :data:`SLOT_FIT` (labels that do not fit the gradient). One solve per gradient and labels."""
    from fcn_analytic.disaggregate import slot_inputs

    gw, gb = capture.last_layer(torch.float64)
    gw, gb = gw.cpu(), None if gb is None else gb.cpu()
    key = (digest(gw, gb), digest(soft.double().cpu()), seed, capture.is_update,
           capture.protocol.loss, float(capture.protocol.temperature))  # one gradient read under another loss

    def solve() -> Tensor | None:
        found = slot_inputs(capture, soft, seed=seed)
        return found.inputs if found is not None and found.residual <= SLOT_FIT else None

    return _SLOTS.get(key, solve)


_FOUND = LRU(64)  # linear_inputs per gradient (sha1)
_HOW = LRU(64)  # which search found them, per gradient (sha1)
FIRST_LINEAR = "first-linear"  # attack.feature_layer: the model's first nn.Linear (after a conv body: its flat map)


def resolve_feature_layer(capture: Capture, layer: str | None) -> str | None:
    """The module name ``attack.feature_layer`` stands for on the capture's model: ``first-linear`` is the first
    ``nn.Linear`` in module order (None when there is none); a name is itself, checked to exist."""
    if layer is None or (layer != FIRST_LINEAR and f"{layer}.weight" in capture.shared):
        return layer  # a shared layer's name needs no model built to check it
    from fcn_analytic.disaggregate import first_linear

    model = capture.model()
    if layer == FIRST_LINEAR:
        return first_linear(model)
    check_feature_layer(model, layer)
    return layer


def check_feature_layer(model: torch.nn.Module, layer: str | None) -> None:
    """Refuse an ``attack.feature_layer`` module name that ``model`` does not have (``last``, None and
    ``first-linear`` always pass): a :class:`ConfigError` listing the valid names. ``gi run`` calls it on the
    victim's model before any capture is made."""
    if layer is None or layer in ("last", FIRST_LINEAR):
        return
    modules = dict(model.named_modules())
    if layer not in modules:
        linear = [n for n, m in modules.items() if isinstance(m, torch.nn.Linear)]
        raise ConfigError(f"attack.feature_layer={layer!r} is no module of the capture's model; valid: last, "
                          f"{FIRST_LINEAR} or one of {linear}")


def layer_inputs(capture: Capture, layer: str, soft: Tensor | None, seed: int = 0, draws: int = 1_000_000
                 ) -> Tensor | None:
    """The per-sample inputs (B, n), float64, of the ``nn.Linear`` layer ``layer`` from its shared weight and bias
    gradients, in slot order; None where the capture does not give them (:func:`fcn_analytic.disaggregate.summed_layer`:
    an update that is not a plain sum of gradients, a layer that is not a Linear with both tensors shared; inputs
    not sparse and nonnegative enough).

    One sample: ``∇Wᵀ∇b/‖∇b‖²`` (every row of ∇W is ``∇b_r·x``). A FedSGD batch:
    :func:`fcn_analytic.disaggregate.linear_inputs` (the vertices of the nonnegative cone in ∇W's row space, then
    SPEAR's sparsity sampling, Dimitrov et al. 2024, on the layer's input side: a ReLU / max-pool feature map),
    which finds the inputs in no particular order; where that finds too few (a one-epoch round of N = 100, whose
    cone's vertices mostly mix several inputs), :func:`fcn_analytic.disaggregate.pursued_inputs` (the label
    stage's search, kept per gradient; :func:`input_search` says which ran); a round of
    several local epochs, whose visits of an image differ by the drift:
    :func:`fcn_analytic.disaggregate.drifting_inputs` (approximate inputs, which the fit refreshes,
    :func:`drift_basis`). They are
    put in slot order by their own labels: the inputs are forwarded through the rest of the net together (the
    client's forward, BatchNorm in the protocol's mode), the last layer's input h_i read, each sample's output
    error δ_i solved from the last layer's gradient ``∇W_L ∝ Σ_i δ_i h_iᵀ`` (least squares), and inputs paired with
    slots by the assignment that puts each slot's class where δ_i is most negative (a cross-entropy error is
    ``p − y``: negative only at the label). ``soft`` None (joint labels): the order found. ``draws``: the search's
    budget (``attack.feature_draws``); ``seed`` its generator's.
    """
    from scipy.optimize import linear_sum_assignment

    from fcn_analytic.disaggregate import drifting_inputs, linear_inputs, pursued_inputs, sample_errors, summed_layer

    summed = summed_layer(capture, layer)
    if summed is None:
        return None
    gw, gb, b = summed.weight, summed.bias, summed.samples
    if b == 1:
        return None if not bool(gb.any()) else (gw.T @ gb / gb.dot(gb)).view(1, -1)
    key = (digest(gw, gb), b, seed, draws, capture.is_update)

    def search() -> Tensor | None:
        try:
            if not summed.once:  # several local epochs: each image's visits differ by the drift
                _HOW.put(key[0], ("drifting_inputs", None))
                return drifting_inputs(gw, gb, b, seed=seed).inputs
            # linear_inputs' 8·B random programs and the spanning selection, not search_inputs' one program per
            # input: on the round of configs/fedavg-round.yaml (seed 0) the images fitted to search_inputs +
            # complete_inputs scored 27.01 dB and 24 of 50 recovered, to linear_inputs' 27.61 dB and 28 of 50
            try:
                _HOW.put(key[0], ("linear_inputs", None))
                return linear_inputs(gw, gb, b, samples=draws, seed=seed, **summed.tolerances).inputs
            except GIError:  # the cone's vertices mix several inputs (a round of N = 100): the pursuit, the
                found = pursued_inputs(gw, gb, b)  # label stage's (fc-inputs) search, kept per gradient
                _HOW.put(key[0], ("pursued_inputs", found.sure))
                return found.inputs
        except GIError:
            return None

    x = _FOUND.get(key, search)  # one search per gradient: label modes, variants and retries reuse it
    if x is None:
        return None
    if soft is None:
        return x
    delta = sample_errors(capture, layer, x, summed.per_mean)[1]
    delta = delta / delta.abs().amax(1, keepdim=True).clamp_min(1e-30)
    rows, cols = linear_sum_assignment((delta @ soft.double().T).numpy())
    order = torch.empty(b, dtype=torch.long)
    order[torch.as_tensor(cols)] = torch.as_tensor(rows)
    return x[order]


def input_search(capture: Capture, layer: str) -> tuple[str, int | None] | None:
    """Which search of :mod:`fcn_analytic.disaggregate` gave :func:`layer_inputs` for this capture's layer, and how
    many of its rows it is sure of (None: not counted; :attr:`fcn_analytic.disaggregate.LinearInputs.sure`); None
    before a search."""
    from fcn_analytic.disaggregate import summed_layer

    summed = summed_layer(capture, layer)
    if summed is None:
        return None
    return _HOW.peek(digest(summed.weight, summed.bias))


def drifting_layer(capture: Capture, layer: str | None) -> SummedLayer | None:
    """The ``nn.Linear`` layer ``layer``'s summed update (:class:`fcn_analytic.disaggregate.SummedLayer`) where the
    capture is a round of several local epochs, whose visits of an image differ by the drift; None for a FedSGD
    batch, a one-epoch round (its inputs are found exactly) or a capture without the layer's summed update."""
    from fcn_analytic.disaggregate import summed_layer

    summed = None if layer is None else summed_layer(capture, layer)
    return None if summed is None or summed.once else summed


def drift_basis(capture: Capture, layer: str | None) -> Tensor | None:
    """The row space (n × r, float64) of :func:`drifting_layer`'s update (:func:`fcn_analytic.disaggregate.row_space`):
    the space every visit of every image lies in, against which the fit refreshes its feature targets
    (``attack.feature_refresh``, :func:`fcn_analytic.disaggregate.null_directions`); None where that is None."""
    from fcn_analytic.disaggregate import row_space

    summed = drifting_layer(capture, layer)
    return None if summed is None else row_space(summed.weight)


def aux_span(images: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """The aux-span image prior's ``(μ, P)``: the mean of the attacker's aux images (N, C, H, W) flattened, and its
    top-``rank`` principal directions (rank × D, orthonormal rows; at most N − 1 of them carry variance)."""
    flat = images.reshape(images.shape[0], -1).double()
    mu = flat.mean(0)
    basis = torch.linalg.svd(flat - mu, full_matrices=False)[2][: min(rank, flat.shape[0])]
    return mu.float(), basis.float()


def analytic_prior(capture: Capture, label_result: LabelResult | None) -> Tensor | None:
    """The analytic inversion (``fcn_analytic.invert``: a fully-connected net, soft-label paper §4.2, or a conv
    body with invertible activations, R-GAP) as (B=1, C, H, W), else None."""
    from fcn_analytic import invert

    try:
        return invert(capture, label_result).image
    except GIError:
        return None


def captured_output_error(capture: Capture) -> Tensor | None:
    """``δ = ∂L/∂z`` (1, C) of a one-sample FedSGD capture: its last-layer bias gradient (``z = W f + b`` gives
    ``∂L/∂b = ∂L/∂z`` whatever the loss); None for a batch (∇b is the mean of B errors), an update or a
    bias-free last layer."""
    if capture.is_update or capture.num_samples != 1:
        return None
    _, gb = capture.last_layer(torch.float32)
    return None if gb is None else gb.reshape(1, -1)


def output_errors(captures: Sequence[Capture], mode: str, joint: bool = False) -> Tensor | None:
    """The output errors (N, 1, C) ``attack.output_error`` asks for (:func:`captured_output_error` of every
    capture): ``simulated`` and joint labels give None, ``auto`` None unless every capture gives one, ``captured``
    a ConfigError naming what is missing."""
    if mode == "simulated" or (joint and mode == "auto"):
        return None
    rows = [captured_output_error(c) for c in captures]
    if all(r is not None for r in rows):
        return torch.stack(rows)
    if mode == "auto":
        return None
    c = captures[[r is None for r in rows].index(True)]
    why = ("it shares an update, not a gradient" if c.is_update else
           f"it has {c.num_samples} samples (∇b is the mean of their errors)" if c.num_samples != 1 else
           f"its last layer {c.last_layer_name!r} has no bias gradient")
    raise ConfigError(f"attack.output_error=captured needs one FedSGD sample with a last-layer bias, but {why}; "
                      "use attack.output_error=auto (falls back to simulated) or simulated")


def update_statistics(capture: Capture, source: str = "update") -> dict[str, tuple[Tensor, Tensor]]:
    """Every BatchNorm layer's batch ``(mean, biased var)`` (C,) of a one-step FedAvg update's buffers
    (:func:`fcn_analytic.batchnorm.batch_statistics`), for ``attack.bn_stats=source``; where the capture cannot
    give them, a one-line :class:`CaptureError` saying why and what to use instead."""
    from fcn_analytic.batchnorm import batch_statistics

    try:
        return batch_statistics(capture)
    except CaptureError as exc:
        raise CaptureError(f"attack.bn_stats={source} reads the client's batch statistics from a one-step FedAvg "
                           f"update's BatchNorm buffers (protocol.scheme=fedavg, one local step, "
                           f"protocol.model_mode=train), but {exc}; or set attack.bn_stats=shared") from None


def bn_targets(capture: Capture, model: torch.nn.Module, source: str) -> dict[str, tuple[Tensor, Tensor]]:
    """BatchNorm targets the threat model grants: ``shared`` reads ``capture.bn_stats`` (the client's batch
    statistics, when the threat model grants them), ``running`` the model's running stats, ``update`` and
    ``decoupled`` the batch statistics of a one-step FedAvg update's buffers (:func:`update_statistics`; a
    :class:`CaptureError` says why where it cannot)."""
    out: dict[str, tuple[Tensor, Tensor]] = {}
    if source in ("update", "decoupled"):
        return {name: (mean.float().reshape(1, -1), var.float().reshape(1, -1))
                for name, (mean, var) in update_statistics(capture, source).items()}
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            continue
        if source == "running":
            if m.running_mean is None:
                continue
            mean, var = m.running_mean, m.running_var
        else:
            if name not in capture.bn_stats:
                continue
            mean, var = capture.bn_stats[name]
        out[name] = (mean.detach().float().reshape(1, -1), var.detach().float().reshape(1, -1))
    return out


def check_inputs(captures: Sequence[Capture], label_results: Sequence[LabelResult | None] | None,
                 features: Sequence[Tensor | None] | None
                 ) -> tuple[list[Capture], list[LabelResult | None], list[Tensor | None]]:
    """The arguments of :func:`build_problem` as lists of one length (None: one None per capture), each capture
    checked to be a :class:`Capture` with exactly one shared message and the images' shape ``in_shape`` (C, H, W)
    in its model spec (a capture made by ``Capture.from_gradients`` / ``from_update`` without ``in_shape`` of a
    model that does not record it has none: a one-line :class:`CaptureError` saying how to give it)."""
    captures = list(captures)
    if not captures:
        raise ConfigError("reconstruct_many needs at least one capture")
    label_results = list(label_results) if label_results is not None else [None] * len(captures)
    features = list(features) if features is not None else [None] * len(captures)
    if len(label_results) != len(captures) or len(features) != len(captures):
        raise ConfigError(f"{len(captures)} captures but {len(label_results)} label results and {len(features)} "
                          "feature tensors")
    for c in captures:
        if not isinstance(c, Capture):
            raise CaptureError(f"reconstruct needs a gi.Capture, got {type(c).__name__}")
        if (c.gradients is None) == (c.update is None):
            raise CaptureError("a capture needs exactly one of gradients (FedSGD) and update (FedAvg) to match")
        shape = c.model_spec.get("in_shape")
        if not isinstance(shape, list | tuple) or len(shape) != 3 or not all(
                isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
            raise CaptureError(f"the capture records no input shape (model_spec in_shape={shape!r}); the "
                               "reconstruction needs the images' (C, H, W): pass in_shape=(C, H, W) to "
                               "gi.Capture.from_gradients / from_update (gi.capture_gradients and the victim read "
                               "it from the images)")
    return captures, label_results, features


def same_model(a: Capture, b: Capture, buffers: bool = False) -> bool:
    """Whether two captures can be rows of one Problem: same model, state, protocol, history and batch size;
    ``buffers``: also the buffers after the round (``attack.bn_stats=decoupled`` builds the model from the batch
    statistics they give, :attr:`gi.attack.recon.config.ReconConfig.decoupled_bn`)."""
    if a.model_spec != b.model_spec or a.protocol != b.protocol or a.num_samples != b.num_samples \
            or a.last_layer_name != b.last_layer_name:
        return False
    if a.is_update != b.is_update or set(a.shared) != set(b.shared) or set(a.model_state) != set(b.model_state):
        return False
    if buffers and (set(a.buffers) != set(b.buffers) or
                    not all(torch.equal(a.buffers[k], b.buffers[k]) for k in a.buffers)):
        return False
    return all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state) and \
        all(torch.equal(a.history.get(k, torch.zeros(0)), b.history.get(k, torch.zeros(0))) for k in a.history)


def capture_features(cfg: ReconConfig, captures: Sequence[Capture], label_results: Sequence[LabelResult | None],
                     given: Sequence[Tensor | None] | None = None) -> list[Tensor | None]:
    """f* (B, D) per capture, the one rule of :func:`build_problem`, the ``gi run`` features stage and ``gi
    ablate``: the ``given`` features, else :func:`feature_targets` at ``cfg.feature_layer`` when the feature term
    is on (a named layer's inputs cost a search, as does the per-slot solve of a batch's last layer), else the
    cheap last-layer targets (the class means for a batch); None where a capture has none (an
    update, a bias-free batch, joint labels without a last-layer bias). Joint labels from a random start (None)
    use only a label-free target: one sample's ``∇Wᵀ∇b/‖∇b‖²`` (eq. 8's f* needs no label when the last layer
    has a bias)."""
    layer = cfg.feature_layer_name if cfg.feature_weight > 0 else None
    out: list[Tensor | None] = []
    for c, label_result, f in zip(captures, label_results, given if given is not None else [None] * len(captures)):
        b = image_slots(c)
        if f is None:
            soft = None if label_result is None else labels_for_slots(label_result, b, c.num_classes)
            f = feature_targets(c, label_result, soft, layer, cfg.seed, cfg.feature_draws, cfg.feature_weight > 0)
        out.append(None if f is None else f.reshape(b, -1))
    return out


def last_layer_source(cfg: ReconConfig, captures: Sequence[Capture],
                      label_results: Sequence[LabelResult | None]) -> str:
    """Where :func:`capture_features`' last-layer f* came from, in words (the features stage's record): one
    sample's ``last_layer_features``, each slot's own feature keyed by its label (:func:`slot_features`, only
    when the feature term is on), the class means, or both with the number of captures each served."""
    if captures[0].num_samples == 1:
        return "last_layer_features"
    solved = 0 if cfg.feature_weight == 0 else sum(label_result is not None and slot_features(
        c, labels_for_slots(label_result, image_slots(c), c.num_classes), cfg.seed) is not None
        for c, label_result in zip(captures, label_results))
    own = "each slot's own, keyed by its label (fcn_analytic.disaggregate.last_layer_inputs)"
    if solved == len(captures):
        return own
    if solved == 0:
        return "grad_W_c / grad_b_c per slot"
    return f"{own} for {solved} of {len(captures)} captures; grad_W_c / grad_b_c per slot for the rest"


NO_FEATURES = ("attack.feature_weight (β) set to 0: no feature target f* (eq. 8) at {layer} for {n} of {total} "
               "capture(s) (the last layer's needs one sample with a last-layer bias or known labels, or a FedSGD "
               "batch with a last-layer bias and labels; a named Linear layer's, inputs sparse enough to be found "
               "in attack.feature_draws; an update has none)")


def _prior(captures: list[Capture], label_results: list[LabelResult | None],
           given: Sequence[Tensor | None] | None = None) -> Tensor:
    """The analytic images (N, 1, C, H, W) of ``init=analytic`` (``given`` ones as they are)."""
    given = list(given) if given is not None else [None] * len(captures)
    priors = [g if g is not None else analytic_prior(c, label_result)
              for c, label_result, g in zip(captures, label_results, given)]
    if any(p is None for p in priors) or captures[0].num_samples != 1:
        from fcn_analytic.invert import PATTERN

        raise ConfigError(f"attack.init=analytic needs one sample of a net fcn_analytic.invert covers (fully "
                          f"connected, or {PATTERN}, invertible activations); use attack.init=uniform")
    return torch.stack(priors)


def build_problem(captures: Sequence[Capture], label_results: Sequence[LabelResult | None] | None,
                  config: ReconConfig, features: Sequence[Tensor | None] | None = None,
                  priors: Sequence[Tensor | None] | None = None, aux_images: Tensor | None = None) -> Problem:
    """The :class:`Problem` of captures of one global model (:func:`same_model`) under ``config``.

    ``label_results`` give the slot labels (:func:`labels_for_slots`; all None with ``labels=joint``: random
    start); ``features`` the f* of eq. 8 per capture (None: from the capture and labels, when
    ``feature_weight`` > 0); ``priors`` the ``init=analytic`` images when already computed (None each:
    :func:`analytic_prior`); ``aux_images`` the attacker's aux images (N, C, H, W), which the ``aux-span`` prior
    needs (:func:`aux_span`). Reads its arguments only; the model is a fresh copy rebuilt from the capture.
    """
    captures, label_results, features = check_inputs(captures, label_results, features)
    first = captures[0]
    if not all(same_model(first, c, config.decoupled_bn) for c in captures[1:]):
        raise ConfigError("build_problem needs captures of one global model (spec, state, protocol, history, batch "
                          "size; with attack.bn_stats=decoupled also the buffers); reconstruct_many reconstructs "
                          "other captures one by one")
    cfg = config
    model = first.model()
    for c in captures:
        c.validate(model)
    if cfg.decoupled_bn:  # the client's batch statistics fixed, its train-mode backward (docs/architecture.md)
        model = decoupled_model(model, update_statistics(first, cfg.bn_stats))
    classes = first.num_classes
    b = image_slots(first)
    joint_random = cfg.labels == "joint" and all(result is None for result in label_results)
    soft = None if joint_random else torch.stack([labels_for_slots(result, b, classes) for result in label_results])
    targets = {k: torch.stack([c.shared[k] for c in captures]) for k in first.shared}
    rows, notes = None, ()
    if cfg.feature_weight > 0:  # one rule for every command: no target, no feature term, and the run says so
        found = capture_features(cfg, captures, label_results, features)
        missing = sum(f is None for f in found)
        if missing:  # without f* a feature-only recipe (match_weight 0) falls back to the plain match term
            cfg = dataclasses.replace(cfg, feature_weight=0.0, match_weight=cfg.match_weight or 1.0)
            where = cfg.feature_layer_name or "the last layer"
            notes = (NO_FEATURES.format(layer=where, n=missing, total=len(captures))
                     + ("; attack.match_weight 0 → 1 (the gradient match instead)" if not config.match_weight else ""),)
        else:
            rows = torch.stack(found)
    weights = match_weights(list(targets), cfg, first.last_layer_name)
    layer = resolve_feature_layer(first, cfg.feature_layer_name) if rows is not None else None
    bases = tuple(drift_basis(c, layer) for c in captures) if cfg.feature_refresh and layer is not None else ()
    span = None
    if cfg.regularizers.get("aux-span") or cfg.init == "aux-mean":
        if aux_images is None or aux_images.shape[0] < 2:
            raise ConfigError("the aux-span prior and attack.init=aux-mean need the attacker's aux images: set "
                              "aux.per_class > 0 (at least 2 images)")
        if tuple(aux_images.shape[1:]) != tuple(int(v) for v in first.model_spec["in_shape"]):
            raise ConfigError(f"the aux images are {tuple(aux_images.shape[1:])}; the model takes "
                              f"{tuple(first.model_spec['in_shape'])}: the aux-span prior needs both alike")
        span = aux_span(aux_images, cfg.aux_rank)
    return Problem(
        model=model, protocol=first.protocol, targets=targets, weights=weights, soft=soft,
        image_shape=tuple(int(s) for s in first.model_spec["in_shape"]), num_samples=b,
        terms=term_weights(cfg, matched=any(w != 0.0 for w in weights.values())),
        batching=choose_batching(cfg.batching, len(captures) * cfg.restarts, model, resolve_device(cfg.device)[0]),
        kind="update" if first.is_update else "gradient", history=dict(first.history),
        features=rows,
        prior=_prior(captures, label_results, priors) if cfg.init == "analytic" else
        span[0].view(1, 1, *first.model_spec["in_shape"]).expand(len(captures), 1, *first.model_spec["in_shape"])
        if cfg.init == "aux-mean" else None,
        bn_targets=bn_targets(first, model, cfg.bn_stats) if cfg.regularizers.get("bn") else None,
        output_error=output_errors(captures, cfg.output_error, joint=cfg.labels == "joint"), notes=notes,
        feature_layer=layer,
        aux_span=span,
        feature_basis=bases if bases and all(basis is not None for basis in bases) else None,
    )
