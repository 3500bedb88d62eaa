"""The verdict of a run: did the attack recover the images? (docs/usage.md, "Verdict").

**With truth** an image is compared with the best of two trivial guesses that need no attack at all: a flat grey
image (0.5 everywhere) and the image's own mean colour (the constant image of its per-channel means). Among
constant images the mean colour has the least MSE (per channel, MSE = σ² + (μ − c)²), so its PSNR is never below
the grey image's, and the margin over it reads as the share of the image's own variance the reconstruction
explains: PSNR − PSNR_mean colour = 10 log10(σ² / MSE), i.e. R² = 1 − 10^(−Δ/10).

- ``not recovered``: PSNR ≤ best trivial + :data:`NOT_RECOVERED_MARGIN_DB` (1 dB: the reconstruction removes at
  most 21 % of the mean colour's error). Failed attacks land here or below: the stalled ReLU LeNet reached 13.3 dB
  against the cat's 14.8 dB mean colour, a 2-iteration one 9.9 dB. A 1 dB margin is about the spread of one
  failed attack over seeds (13.6–14.3 dB), while a picture of the layout alone (4×4 blocks of the right
  colours) is 3–7 dB above the mean colour, so it stays ``partial``.
- ``recovered``: PSNR ≥ :data:`RECOVERED_MIN_PSNR_DB` (25 dB) and ≥ best trivial + :data:`RECOVERED_MARGIN_DB`
  (10 dB: 90 % of the image's variance explained). On the 32 px CIFAR-10 samples 25 dB is a copy that differs
  from the image by faint noise (an RMS pixel error of 0.056); 20–24 dB images are plainly the
  picture but noisy or faded (what partial optimisations reach), hence ``partial``. The relative bar binds only
  for low-contrast images, whose mean colour alone scores above 15 dB. The analytic inversions reach ~100 dB.
- ``partial``: in between.

**Without truth** the attack's own signal decides, per capture: the relative mismatch ‖s(x̂) − s*‖ / ‖s*‖ of the
shared gradient (or update) that the final images and labels reproduce
(:func:`gi.attack.recon.mismatch.shared_mismatch`). Below :data:`EXPLAINED_BELOW` the reconstruction
``explains`` the capture; at or above :data:`UNEXPLAINED_FROM` it ``does not explain`` it; ``partly explains`` in
between. The mismatch is one-sided evidence: a large one proves the images (or their labels) wrong, a small one
is necessary for a recovery but not sufficient (the measurements behind the thresholds: :data:`EXPLAINED_BELOW`).

**Per image without truth**: a batch's images explain its gradient together, but an image whose own share of the
gradient is small can be anything without moving the mismatch (a batch of 8 with two noise images read
``explains`` at 2e-4). Each slot is therefore swapped for its own mean colour, the trivial guess the verdict with
truth compares with, and the distance d the share moves measured
(:func:`gi.attack.recon.mismatch.slot_swap_distances`). A slot is pinned by its capture when d is at least
:data:`PINNED_RATIO` times the capture's own mismatch m (what the fit leaves unexplained) and above the float32
simulation's rounding (:data:`PINNED_FLOOR`); then it takes its capture's word, else it reads :data:`NOT_PINNED`
(the capture tells the image from its mean colour by little more than it fails to explain, so nothing in it says
the image is better). The rule is a ratio, so a net whose gradient barely depends on the images (a sigmoid LeNet
at PyTorch's init: swaps move a true batch's gradient by 1e-3) still pins an exact answer (m ~ 1e-6). A capture
that does not explain its share leaves every slot ``does not explain``.

**The images without truth** (``estimates``): the words above describe the share; what they say of each image
depends on how the answer was reached, so the estimate of the verdict with truth is calibrated per kind of
evidence (:data:`CALIBRATIONS`, keyed by :data:`EVIDENCE_KINDS`: the analytic walk's direct answer, an optimisation
against a FedSGD gradient by its distance or by its angle, one against a shared update, a fit that did not match
the share at all) and says ``recovered`` or ``not recovered`` only where that kind's measured groups are apart,
else :data:`UNDECIDED` (:func:`image_estimate`). A mismatch that separates recovered from failed images on one net
does not on another: the sigmoid LeNet's recovered images leave at most 1.4e-3, ResNet-18's under the angle fit
0.13–0.15, S3's 4-step FedAvg updates 0.067 on recovered and partial images alike, the ``fc-inputs`` fit 0.30–0.48
on partial ones (docs/results/realistic.md, "The verdict without truth across nets").

**Features** (where the attack matched them: eq. 8's f*, or the inputs of ``attack.feature_layer`` found from
that layer's gradient), per capture, with or without truth: whether f* explains the gradient of the layer it is
the input of (the residual of :func:`fcn_analytic.disaggregate.factor_residual`, under the same thresholds as the
mismatch), and how far the final images are from reproducing f* (:func:`gi.attack.recon.mismatch.feature_mismatch`,
a number, no word: how a feature error maps to image quality depends on the net). It says what leaked short of the
image: on a trained BatchNorm CNN the first fully-connected layer's inputs of every sample come out exact (residual
~1e-8) while the images are only partial and do not explain the gradient.

**Prior-filled pixels** (where the analytic walk reached the input): a ReLU's dead units drop their forward
equations, so the input layer can have fewer independent equations than pixels, and the image prior fills what
they leave free (:func:`fcn_analytic.prior.refine_input`). Those pixels are the prior's guess, not the capture's;
the record says per capture how many at least (:func:`prior_summary`), with or without truth, and no word changes:
the ReLU LeNet captures of docs/results/realistic.md (S1) leave 361–1001 of their 3072 input values to the prior,
and most come back recovered all the same.

The rule here is pure (floats and words); :func:`trivial_baselines` scores the two guesses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

RECOVERED = "recovered"
PARTIAL = "partial"
NOT_RECOVERED = "not recovered"
IMAGE_VERDICTS = (RECOVERED, PARTIAL, NOT_RECOVERED)

NOT_RECOVERED_MARGIN_DB = 1.0  # at most this far above the best trivial guess: not recovered
RECOVERED_MIN_PSNR_DB = 25.0  # recovered needs at least this PSNR ...
RECOVERED_MARGIN_DB = 10.0  # ... and at least this far above the best trivial guess

EXPLAINS = "explains"
PARTLY_EXPLAINS = "partly explains"
DOES_NOT_EXPLAIN = "does not explain"
MISMATCH_VERDICTS = (EXPLAINS, PARTLY_EXPLAINS, DOES_NOT_EXPLAIN)
CANNOT_TELL = "cannot tell"  # the capture cannot be re-simulated (a round's unknown batch order): no word of the three
UNKNOWN_ORDER = ("the round's batch order is unknown, so its update cannot be re-simulated from the images "
                 "(gi.world.fl.local.order_known); the feature verdict, where there is one, still holds")

# Relative mismatch thresholds, measured on the DLG LeNet (sigmoid) with CIFAR-10 samples (cifar10-samples 0-6,
# gi run configs/demo.yaml; docs/usage.md "Verdict"), mismatch -> PSNR (dB above the mean colour): the truth
# itself 0 (the simulator is the victim's); the analytic answer 1.1e-6 -> 111 dB; optimisations from noise
# (attack.analytic=false) 1.1e-5 -> 70.9 (2600 iterations), 2.3e-4 -> 43.5 (1000): recovered; 6.4e-3 to 9.7e-3
# -> 18.8-21.6 dB (+6 to +9; 300-600 iterations): partial; 0.049-0.086 -> 12.0-14.6 dB (-2.5 to +1.8; 150
# iterations) and 0.16 -> 11.5 (50): at the trivial guess; stalled ReLU LeNets 0.28-1.0 -> 9-13 dB (below it).
# A flat grey image with the true label scores 0.46-0.96, a random one 0.64-1.1: the gradient must be matched to
# well under 1 % before the image is right. Other nets may map the mismatch to image quality differently.
EXPLAINED_BELOW = 1e-3
UNEXPLAINED_FROM = 3e-2  # 0.03
# A slot is pinned by its capture when swapping its image for its own mean colour moves the share (relative to
# ‖s*‖) by at least PINNED_RATIO times the capture's mismatch. Measured on the sigmoid LeNet's batches of 8 (gi run
# configs/batch8-default.yaml seed=0, 1, 2: 120 images; docs/usage.md "Verdict"): the ratio is 44 to 9900 for the 78
# recovered images, 0.8 to 15 for the 14 not recovered, 5.5 to 79 for the 28 partial; 20 sits between the first two.
PINNED_RATIO = 20.0
PINNED_FLOOR = 1e-5  # a swap moving the share by less is float32 rounding of the simulation (analytic answers: ~1e-6)
NOT_PINNED = "not pinned"  # a slot whose capture reads about the same with the image replaced by its mean colour
SLOT_VERDICTS = (EXPLAINS, PARTLY_EXPLAINS, NOT_PINNED, DOES_NOT_EXPLAIN)

GUESS_NAMES = {"grey": "a flat grey image", "mean_colour": "each image's mean colour"}

UNDECIDED = "undecided"  # the capture's evidence of this kind does not separate recovered from failed images
ESTIMATES = (RECOVERED, NOT_RECOVERED, UNDECIDED)


@dataclass(frozen=True)
class Calibration:
    """Where one kind of evidence tells recovered from failed images (module docstring, "The images without truth"):
    a slot pinned by its capture (swap ≥ :data:`PINNED_RATIO` × mismatch) whose capture's mismatch is below
    ``recovered_below`` is estimated ``recovered``; every slot of a capture at or above ``failed_from``, and a slot
    whose swap moves the share by under ``loose_below`` × the mismatch (or under :data:`PINNED_FLOOR`), ``not
    recovered``; anything else :data:`UNDECIDED`. None: that kind's measurements place no such threshold.
    ``measured``: the tuning runs behind the numbers."""

    recovered_below: float | None
    failed_from: float | None
    loose_below: float | None
    measured: str


ANALYTIC = "analytic"  # the analytic inversion answered the capture directly
GRADIENT = "gradient-l2"  # optimised against a FedSGD gradient by its distance (also from the analytic inversion)
COSINE = "gradient-cosine"  # optimised against a FedSGD gradient by its angle (Inverting Gradients; the resnet preset)
UPDATE = "update"  # optimised against a shared update (FedAvg-like local steps)
UNMATCHED = "unmatched"  # the fit did not match the shared tensors (attack.match_weight 0: the fc-inputs preset)
EVIDENCE_KINDS = (ANALYTIC, GRADIENT, COSINE, UPDATE, UNMATCHED)

# Tuning runs only (fashion-mnist and cifar10-samples; docs/results/realistic.md, "The verdict without truth across
# nets"); ratios are swap distance over the capture's mismatch.
CALIBRATIONS: dict[str, Calibration] = {
    ANALYTIC: Calibration(
        recovered_below=EXPLAINED_BELOW, failed_from=None, loose_below=None,
        measured="ReLU LeNet single images answered by the walk (cifar10-samples 0-19, both inits, seeds 0-1): 75 "
                 "recovered at 4.6e-5 to 2.2e-2 (67 below 1e-3), none failed; the sigmoid LeNet's answers ~1e-6"),
    GRADIENT: Calibration(
        recovered_below=EXPLAINED_BELOW, failed_from=UNEXPLAINED_FROM, loose_below=4.0,
        measured="sigmoid LeNet batches of 8 (fashion-mnist, seeds 0-2, 120 images): recovered at most 1.4e-3, "
                 "ratio 44-9900; partial ratio 5.5-79; not recovered ratio 0.8-15; the ReLU LeNet's failed walks, "
                 "optimised from the inversion, 0.078-0.11; sigmoid LeNet single images at the trivial guess "
                 "0.049-0.16"),
    COSINE: Calibration(
        recovered_below=None, failed_from=None, loose_below=None,
        measured="ResNet-18 single images under the resnet preset (cifar10-samples 0-3, seed 0): 3 recovered "
                 "(29-30 dB) and 1 partial (23 dB) at 0.13-0.16: the angle fit never drives the distance down; no "
                 "failed image measured"),
    UPDATE: Calibration(
        recovered_below=None, failed_from=None, loose_below=None,
        measured="ReLU LeNet FedAvg updates of 4 local steps (fashion-mnist, seeds 0-1, 24 images): recovered "
                 "(26-31 dB) and partial images alike at 0.067-0.14, ratios 1.4-7.6"),
    UNMATCHED: Calibration(
        recovered_below=None, failed_from=None, loose_below=None,
        measured="trained BatchNorm cnn under fc-inputs (fashion-mnist, seeds 0-1, 48 images): 0.30-0.48 on images "
                 "1-10 dB above their mean colour; the fit never matched the gradient"),
}


def image_verdict(psnr: float, trivial_psnr: float) -> str:
    """``recovered`` / ``partial`` / ``not recovered`` of one image scored ``psnr`` dB whose best trivial guess
    scored ``trivial_psnr`` dB (the module docstring's rule; an identical image, ``psnr = inf``, is recovered)."""
    if math.isnan(psnr):
        return NOT_RECOVERED
    if psnr <= trivial_psnr + NOT_RECOVERED_MARGIN_DB:
        return NOT_RECOVERED
    if psnr >= RECOVERED_MIN_PSNR_DB and psnr >= trivial_psnr + RECOVERED_MARGIN_DB:
        return RECOVERED
    return PARTIAL


def mismatch_verdict(mismatch: float, known: bool = True) -> str:
    """``explains`` / ``partly explains`` / ``does not explain`` for a relative mismatch (NaN: does not explain);
    :data:`CANNOT_TELL` where the capture cannot be re-simulated (``known`` false: :data:`UNKNOWN_ORDER`)."""
    if not known:
        return CANNOT_TELL
    if math.isnan(mismatch) or mismatch >= UNEXPLAINED_FROM:
        return DOES_NOT_EXPLAIN
    return EXPLAINS if mismatch < EXPLAINED_BELOW else PARTLY_EXPLAINS


def slot_verdict(mismatch: float, swap: float | None, known: bool = True) -> str:
    """One slot's word without truth (module docstring, "Per image without truth"): its capture's
    :func:`mismatch_verdict`, or :data:`NOT_PINNED` where the capture explains it at least partly but swapping the
    slot's image for its own mean colour moves the share (``swap``) by less than :data:`PINNED_RATIO` times the
    capture's mismatch or less than :data:`PINNED_FLOOR` (None or NaN: not measured, the capture's word)."""
    word = mismatch_verdict(mismatch, known)
    if word not in (EXPLAINS, PARTLY_EXPLAINS) or swap is None or math.isnan(swap):
        return word
    return word if moves_share(swap, mismatch, PINNED_RATIO) else NOT_PINNED


def moves_share(swap: float, mismatch: float, ratio: float) -> bool:
    """Whether a slot's swap for its mean colour moves the share by at least ``ratio`` times its capture's
    mismatch and above the float32 simulation's rounding (:data:`PINNED_FLOOR`): the one test behind pinned
    (:data:`PINNED_RATIO`) and loose (:attr:`Calibration.loose_below`) slots."""
    return swap >= max(ratio * mismatch, PINNED_FLOOR)


def slot_verdicts(mismatch: float, swaps: Sequence[float] | None, known: bool = True) -> list[str] | None:
    """:func:`slot_verdict` of every slot of one capture (None where its slots were not measured)."""
    return None if swaps is None else [slot_verdict(mismatch, float(d), known) for d in swaps]


def evidence_kind(analytic: bool, matched: bool, update: bool, objective: str = "l2") -> str:
    """The kind of evidence a reconstruction's capture gives of it (:data:`EVIDENCE_KINDS`): :data:`ANALYTIC` where
    the analytic inversion answered it directly, :data:`UNMATCHED` where the fit did not match the shared tensors
    (``matched`` false), :data:`UPDATE` for a shared update, else ``gradient-<objective>`` (:data:`GRADIENT` for the
    distance ``l2``, :data:`COSINE` for the angle; another objective names a kind without a calibration, so its
    images read :data:`UNDECIDED`)."""
    if analytic:
        return ANALYTIC
    if not matched:
        return UNMATCHED
    return UPDATE if update else f"gradient-{objective}"


def image_estimate(mismatch: float, swap: float | None, kind: str | None, known: bool = True) -> str:
    """One slot's estimate of the verdict with truth, without truth (module docstring, "The images without truth"):
    ``recovered`` / ``not recovered`` where :data:`CALIBRATIONS`' entry for its evidence ``kind`` separates them,
    :data:`UNDECIDED` otherwise, for a kind without a calibration (None: not recorded) and where the capture cannot
    be re-simulated (``known`` false). A NaN mismatch (a capture that shares nothing, answered by a flat grey image,
    or a non-finite reconstruction) is ``not recovered``. ``swap``: :func:`gi.attack.recon.mismatch.
    slot_swap_distances`' value for the slot (None or NaN: not measured, so no estimate rests on it)."""
    if not known:
        return UNDECIDED
    if math.isnan(mismatch):
        return NOT_RECOVERED
    cal = CALIBRATIONS.get(kind)
    if cal is None:
        return UNDECIDED
    if cal.failed_from is not None and mismatch >= cal.failed_from:
        return NOT_RECOVERED
    if swap is None or math.isnan(swap):
        return UNDECIDED
    if cal.loose_below is not None and not moves_share(swap, mismatch, cal.loose_below):
        return NOT_RECOVERED
    if cal.recovered_below is not None and mismatch < cal.recovered_below and moves_share(swap, mismatch,
                                                                                          PINNED_RATIO):
        return RECOVERED
    return UNDECIDED


def image_estimates(mismatch: float, swaps: Sequence[float] | None, kind: str | None, known: bool = True,
                    size: int = 1) -> list[str]:
    """:func:`image_estimate` of every slot of one capture (``size`` slots where ``swaps`` is None)."""
    values: Sequence[float | None] = [None] * size if swaps is None else swaps
    return [image_estimate(mismatch, None if d is None else float(d), kind, known) for d in values]


def estimate_sentence(estimates: Sequence[Sequence[str] | None]) -> str:
    """The clause on the images' estimates without truth, e.g. ``by the capture's own evidence 5 of 8 images
    recovered, 1 not recovered, 2 undecided``; empty where nothing was estimated."""
    words = [w for capture in estimates if capture is not None for w in capture]
    if not words:
        return ""
    n = tally(words, ESTIMATES)
    parts = [f"{n[RECOVERED]} of {len(words)} image{'s' if len(words) != 1 else ''} recovered"]
    parts += [f"{n[w]} {w}" for w in (NOT_RECOVERED, UNDECIDED) if n[w]]
    return "by the capture's own evidence " + ", ".join(parts)


def overall(verdicts: Sequence[str], words: Sequence[str] = IMAGE_VERDICTS) -> str:
    """One word for a run: the first of ``words`` (the best) when every item has it, the last (the worst) when
    every item has it, the middle one otherwise (and for an empty run)."""
    if verdicts and all(v == words[0] for v in verdicts):
        return words[0]
    if verdicts and all(v == words[-1] for v in verdicts):
        return words[-1]
    return words[1]


def tally(verdicts: Sequence[str], words: Sequence[str]) -> dict[str, int]:
    """How many items got each of ``words``, every word listed (0 too)."""
    return {w: sum(v == w for v in verdicts) for w in words}


def best_guess(grey_psnr: float, mean_colour_psnr: float) -> str:
    """``grey`` or ``mean_colour``: the trivial guess with the higher PSNR (the mean colour on a tie)."""
    return "grey" if grey_psnr > mean_colour_psnr else "mean_colour"


def image_sentence(verdicts: Sequence[str], guesses: Sequence[str]) -> str:
    """The run's verdict in words, e.g. ``3 of 10 images recovered, 7 not recovered (at most 1 dB above the best
    trivial guess: each image's mean colour)``; ``guesses`` names each image's best trivial guess
    (:func:`best_guess`)."""
    n = tally(verdicts, IMAGE_VERDICTS)
    total = len(verdicts)
    names = sorted({GUESS_NAMES[g] for g in guesses})
    which = names[0] if len(names) == 1 else "the better of a flat grey image and the image's mean colour"
    parts = [f"{n[RECOVERED]} of {total} image{'s' if total != 1 else ''} recovered"]
    if n[PARTIAL]:
        parts.append(f"{n[PARTIAL]} partial (above the best trivial guess, short of recovered)")
    if n[NOT_RECOVERED]:
        parts.append(f"{n[NOT_RECOVERED]} not recovered (at most {NOT_RECOVERED_MARGIN_DB:g} dB above the best "
                     f"trivial guess: {which})")
    return ", ".join(parts)


def mismatch_phrase(mismatch: float, what: str = "gradient", known: bool = True) -> str:
    """One capture's mismatch verdict in words, e.g. ``the reconstruction does not explain the gradient (relative
    mismatch 0.81)``; ``what``: ``gradient`` or ``update``; ``known`` false: :data:`CANNOT_TELL` and why."""
    if not known:
        return f"{CANNOT_TELL} whether the reconstruction explains the {what}: {UNKNOWN_ORDER}"
    if math.isnan(mismatch):  # an all-zero capture (nothing to explain) or a non-finite reconstruction
        return f"the reconstruction {mismatch_verdict(mismatch)} the {what} (no mismatch measured)"
    return f"the reconstruction {mismatch_verdict(mismatch)} the {what} (relative mismatch {mismatch:.2g})"


def mismatch_sentence(mismatches: Sequence[float], what: str = "gradient", known: Sequence[bool] | None = None
                      ) -> str:
    """The run's mismatch verdict in words: one capture's :func:`mismatch_phrase`, or for several the captures per
    verdict and the range of the mismatch, e.g. ``the reconstruction explains the gradient of 1 of 3 captures,
    does not explain it for 2 (relative mismatch 1e-06 to 0.9)``. ``known``: per capture whether it can be
    re-simulated (default all; :func:`mismatch_verdict`)."""
    known = [True] * len(mismatches) if known is None else list(known)
    if len(mismatches) == 1:
        return mismatch_phrase(mismatches[0], what, known[0])
    if not any(known):
        return f"{CANNOT_TELL} whether the reconstruction explains the {what}s: {UNKNOWN_ORDER}"
    unknown = len(known) - sum(known)
    mismatches = [m for m, k in zip(mismatches, known) if k]
    n = tally([mismatch_verdict(m) for m in mismatches], MISMATCH_VERDICTS)
    parts = [(word, count) for word, count in n.items() if count]
    said = [f"{parts[0][0]} the {what} of {parts[0][1]} of {len(mismatches)} captures"]
    said += [f"{word} it for {count}" for word, count in parts[1:]]
    finite = [m for m in mismatches if not math.isnan(m)]  # NaN: a capture with no gradient to explain
    spread = f"relative mismatch {min(finite):.2g} to {max(finite):.2g}" if finite else "no mismatch measured"
    unmeasured = len(mismatches) - len(finite)
    return (f"the reconstruction {', '.join(said)} ({spread}"
            + (f"; {unmeasured} capture(s) share no gradient" if finite and unmeasured else "") + ")"
            + (f"; {CANNOT_TELL} for {unknown} more: {UNKNOWN_ORDER}" if unknown else ""))


def feature_summary(layer: str, residuals: Sequence[float | None], image_mismatches: Sequence[float | None],
                    slot_mismatches: Sequence[Sequence[float] | None] | None = None,
                    sure: Sequence[Sequence[int] | None] | None = None,
                    slot_swaps: Sequence[Sequence[float] | None] | None = None) -> dict[str, Any]:
    """The ``verdict.features`` record (module docstring, "Features"): per capture whether the matched features
    explain the gradient of ``layer`` (``targets``, :func:`mismatch_verdict` of ``residuals``; None where that
    layer's gradient is not shared), the residuals, the images' relative feature mismatch (per capture, and per
    slot in ``slot_mismatches``: each image against its own slot's target), and the sentence, e.g.
    ``the feature target (the inputs of body.1) explains that layer's gradient for 3 of 3 captures (residual at
    most 4.1e-08); the images reproduce them to a relative mismatch of 0.081 to 0.15``. ``sure``: per capture
    ``[sure, rows]`` where the target's search is sure of fewer than all its rows (None: all, or not counted); the
    sentence then says so, since any basis of the layer's row space explains its gradient (the residual cannot tell
    a wrong row). ``slot_swaps``: per slot the same mismatch for its image's own mean colour
    (:func:`gi.attack.recon.mismatch.feature_swap_mismatches`; ``slot_feature_swap``, reported, not judged)."""
    words = [None if r is None else mismatch_verdict(r) for r in residuals]
    measured = [r for r in residuals if r is not None]
    what = f"the feature target (the inputs of {layer})"
    if measured:
        n = tally([w for w in words if w is not None], MISMATCH_VERDICTS)
        said = [f"{word} that layer's gradient for {count} of {len(measured)} captures"
                for word, count in n.items() if count]
        sentence = f"{what} {'; '.join(said)} (residual at most {max(measured):.2g})"
    else:
        sentence = f"{what}: that layer's gradient is not shared, so they are not checked against it"
    unsure = [pair for pair in (sure or []) if pair is not None]
    if unsure:
        counts = ", ".join(f"{k} of {n}" for k, n in unsure)
        sentence += (f"; its search is sure of only {counts} rows ({len(unsure)} of {len(residuals)} captures): the "
                     f"others are its best guesses, which the residual cannot tell from inputs")
    fits = [m for m in image_mismatches if m is not None and not math.isnan(m)]
    if fits:
        spread = f"{fits[0]:.2g}" if len(fits) == 1 else f"{min(fits):.2g} to {max(fits):.2g}"
        sentence += f"; the images reproduce them to a relative mismatch of {spread}"
    slots = [None] * len(residuals) if slot_mismatches is None else [None if m is None else [float(v) for v in m]
                                                                     for m in slot_mismatches]
    swaps = [None] * len(residuals) if slot_swaps is None else [None if m is None else [float(v) for v in m]
                                                                for m in slot_swaps]
    return {"layer": layer, "summary": sentence, "targets": words, "target_residual": list(residuals),
            "image_feature_mismatch": list(image_mismatches), "slot_feature_mismatch": slots,
            "slot_feature_swap": swaps,
            "target_sure": [None if p is None else [int(v) for v in p] for p in sure] if sure is not None
            else [None] * len(residuals), "rule": FEATURE_RULE}


def prior_summary(layer: str, free: Sequence[int | None], unknowns: Sequence[int | None]) -> dict[str, Any] | None:
    """The ``verdict.prior`` record (module docstring, "Prior-filled pixels"): per capture the input values of
    ``layer`` that the walk's equations leave to the image prior at least (``free``; None where the prior filled
    nothing) out of ``unknowns``, and the sentence, e.g. ``the image prior fills at least 499 to 1001 of the 3072
    input values (body.0) of 10 of 10 captures: the capture's equations do not determine them``. None where no
    capture's input was filled."""
    filled = [(f, u) for f, u in zip(free, unknowns) if f is not None and u is not None]
    if not filled:
        return None
    least, most = min(f for f, _ in filled), max(f for f, _ in filled)
    spread = f"{least}" if least == most else f"{least} to {most}"
    sizes = sorted({u for _, u in filled})
    of = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
    sentence = (f"the image prior fills at least {spread} of the {of} input values ({layer}) of {len(filled)} of "
                f"{len(free)} captures: the capture's equations do not determine them")
    return {"layer": layer, "free": list(free), "unknowns": list(unknowns), "summary": sentence}


RULE = (f"recovered: PSNR >= {RECOVERED_MIN_PSNR_DB:g} dB and >= the best trivial guess + {RECOVERED_MARGIN_DB:g} "
        f"dB; not recovered: PSNR <= the best trivial guess + {NOT_RECOVERED_MARGIN_DB:g} dB; partial: between. "
        "Trivial guesses: a flat grey image and the image's mean colour (docs/usage.md, Verdict)")
MISMATCH_RULE = (f"relative mismatch of the shared tensors below {EXPLAINED_BELOW:g}: explains; at or above "
                 f"{UNEXPLAINED_FROM:g}: does not explain; partly explains between; an image whose swap for its own "
                 f"mean colour moves the share by less than {PINNED_RATIO:g} times the mismatch: not pinned "
                 "(docs/usage.md, Verdict)")
ESTIMATE_RULE = ("per image without truth, by the kind of evidence (analytic / gradient / update / unmatched): "
                 "recovered where its capture's mismatch is below that kind's calibrated threshold and the slot is "
                 "pinned, not recovered at or above its failure threshold or where the slot moves the share by "
                 "little, undecided where the kind's measured groups overlap (gi/analysis/verdict.py CALIBRATIONS; "
                 "docs/usage.md, Verdict)")

FEATURE_RULE = (f"features: the residual of the matched features against their layer's weight and bias gradients "
                f"(least-squares output errors), below {EXPLAINED_BELOW:g}: explains; at or above "
                f"{UNEXPLAINED_FROM:g}: does not explain; the images' relative feature mismatch is reported, not "
                "judged (docs/usage.md, Verdict)")


def image_summary(psnrs: Sequence[float], grey_psnrs: Sequence[float], mean_colour_psnrs: Sequence[float]
                  ) -> dict[str, Any]:
    """The ``verdict`` record of images scored against truth: per image (``images``, ``best_trivial_guess``), the
    counts, the run's word (``overall``), the sentence (``summary``) and the rule."""
    guesses = [best_guess(g, m) for g, m in zip(grey_psnrs, mean_colour_psnrs)]
    trivial = [max(g, m) for g, m in zip(grey_psnrs, mean_colour_psnrs)]
    verdicts = [image_verdict(p, t) for p, t in zip(psnrs, trivial)]
    return {"basis": "truth", "overall": overall(verdicts), "summary": image_sentence(verdicts, guesses),
            "counts": tally(verdicts, IMAGE_VERDICTS), "images": verdicts, "best_trivial_guess": guesses,
            "rule": RULE}


def slot_sentence(slots: Sequence[Sequence[str] | None]) -> str:
    """The clause on the slots that are not pinned (module docstring, "Per image without truth"), e.g. ``2 of 24
    images are not pinned by their capture: it reads about the same with each replaced by its own mean colour``;
    empty where every measured slot is pinned or none was measured."""
    words = [w for capture in slots if capture is not None for w in capture]
    loose = sum(w == NOT_PINNED for w in words)
    if not loose:
        return ""
    return (f"{loose} of {len(words)} image{'s' if len(words) != 1 else ''} {'is' if loose == 1 else 'are'} not "
            f"pinned by {'its' if loose == 1 else 'their'} capture: it reads about the same with "
            f"{'it' if loose == 1 else 'each'} replaced by its own mean colour")


def mismatch_summary(mismatches: Sequence[float], what: str = "gradient", known: Sequence[bool] | None = None,
                     swaps: Sequence[Sequence[float] | None] | None = None,
                     kinds: Sequence[str | None] | None = None, sizes: Sequence[int] | None = None
                     ) -> dict[str, Any]:
    """The ``verdict`` record from the attack's own signal: per capture (``captures``, ``gradient_mismatch``), per
    slot where ``swaps`` measured them (``slots``, :func:`slot_verdicts`, and ``slot_swap_distance``; None per
    capture where not), the counts, the run's word (``overall``: of the captures that can be re-simulated,
    :data:`CANNOT_TELL` when none can; never ``explains`` while a slot is :data:`NOT_PINNED`), the sentence
    (``summary``) and the rule. ``known``: :func:`mismatch_verdict`'s, per capture. ``kinds``: per capture its
    evidence kind (:data:`EVIDENCE_KINDS`), and then per slot the estimate of the verdict with truth
    (``estimates``, :func:`image_estimates`; ``sizes``: each capture's slots, for those without swaps) with
    ``evidence`` and a clause of the sentence (:func:`estimate_sentence`)."""
    known = [True] * len(mismatches) if known is None else list(known)
    swaps = [None] * len(mismatches) if swaps is None else list(swaps)
    verdicts = [mismatch_verdict(m, k) for m, k in zip(mismatches, known)]
    slots = [slot_verdicts(m, d, k) for m, d, k in zip(mismatches, swaps, known)]
    estimates = None
    if kinds is not None:
        sizes = [1] * len(mismatches) if sizes is None else list(sizes)
        estimates = [image_estimates(m, d, kind, k, n)
                     for m, d, kind, k, n in zip(mismatches, swaps, kinds, known, sizes)]
    judged = [v for v in verdicts if v != CANNOT_TELL]
    counts = tally(judged, MISMATCH_VERDICTS) | ({CANNOT_TELL: len(verdicts) - len(judged)} if len(judged) <
                                                  len(verdicts) else {})
    word = overall(judged, MISMATCH_VERDICTS) if judged else CANNOT_TELL
    loose = slot_sentence(slots)
    if loose and word == EXPLAINS:
        word = PARTLY_EXPLAINS
    clauses = [c for c in (loose, estimate_sentence(estimates or [])) if c]
    record = {"basis": "gradient mismatch", "overall": word,
              "summary": "; ".join([mismatch_sentence(mismatches, what, known), *clauses]),
              "counts": counts, "captures": verdicts, "gradient_mismatch": list(mismatches),
              "slots": slots, "slot_swap_distance": [None if d is None else [float(v) for v in d] for d in swaps],
              "rule": MISMATCH_RULE}
    if estimates is not None:
        record.update(estimates=estimates, evidence=list(kinds or []), estimate_counts=tally(
            [w for capture in estimates for w in capture], ESTIMATES), estimate_rule=ESTIMATE_RULE)
    return record


MAX_LABELS_SHOWN = 8  # captures whose labels the verdict line names; the rest are in metrics.json


def labels_phrase(labels: Sequence[Sequence[int] | None]) -> str:
    """The labels the reconstructions carry, in words, per capture in slot order (a batch's recovered counts as
    one label per slot), e.g. ``recovered label 3``, ``recovered labels 0, 0, 2, 7`` or, for several captures,
    ``recovered labels per capture: 0: 3; 1: 5, 7``; None (a capture that shares nothing) reads ``none``. At most
    :data:`MAX_LABELS_SHOWN` captures are named."""
    def said(slots: Sequence[int] | None) -> str:
        return "none (the capture shares nothing)" if slots is None else ", ".join(str(int(c)) for c in slots)

    if len(labels) == 1:
        slots = labels[0]
        return f"recovered label{'' if slots is not None and len(slots) == 1 else 's'} {said(slots)}"
    shown = "; ".join(f"{k}: {said(slots)}" for k, slots in enumerate(labels[:MAX_LABELS_SHOWN]))
    more = len(labels) - MAX_LABELS_SHOWN
    return (f"recovered labels per capture: {shown}"
            + (f"; {more} more capture(s) in metrics.json (verdict.labels)" if more > 0 else ""))


@dataclass(frozen=True)
class AttackVerdict:
    """The verdict an attack gives without truth (module docstring, "Without truth" and "Features"): per capture
    the mismatch verdict of the shared gradient or update (``gradient``: :func:`mismatch_summary`'s record), the
    feature record where features were matched (``features``: :func:`feature_summary`'s, else None), the labels
    each reconstruction slot carries (``labels``: per capture, slot order; None for a capture that shares
    nothing) and the prior-filled input values where the walk reached the input (``prior``: :func:`prior_summary`'s
    record, else None). ``record`` is ``metrics.json``'s ``verdict`` of a run without truth, ``sentence`` its
    summary line."""

    gradient: dict[str, Any]
    features: dict[str, Any] | None
    labels: list[list[int] | None]
    prior: dict[str, Any] | None = None

    @property
    def mismatch(self) -> list[str]:
        """Per capture: ``explains`` / ``partly explains`` / ``does not explain`` (:func:`mismatch_verdict`)."""
        return list(self.gradient["captures"])

    @property
    def slots(self) -> list[list[str] | None]:
        """Per capture, per slot: its capture's word or ``not pinned`` (:func:`slot_verdict`); None for a capture
        whose slots were not swapped (one that cannot be re-simulated)."""
        return [None if words is None else list(words) for words in self.gradient.get("slots", [])]

    @property
    def estimates(self) -> list[list[str]] | None:
        """Per capture, per slot: the estimate of the verdict with truth (``recovered`` / ``not recovered`` /
        ``undecided``, :func:`image_estimate`); None where the evidence kinds were not recorded."""
        got = self.gradient.get("estimates")
        return None if got is None else [list(words) for words in got]

    @property
    def overall(self) -> str:
        """The run's word (:func:`overall` of :attr:`mismatch`, never ``explains`` while a slot is not pinned)."""
        return self.gradient["overall"]

    @property
    def counts(self) -> list[dict[int, int] | None]:
        """Per capture: how many slots carry each label (only the labels present)."""
        return [None if slots is None else {c: slots.count(c) for c in sorted(set(slots))} for slots in self.labels]

    @property
    def record(self) -> dict[str, Any]:
        """``metrics.json``'s ``verdict`` without truth: the mismatch record, ``features``, ``prior`` and
        ``labels``."""
        return {**self.gradient, **({"features": self.features} if self.features is not None else {}),
                **({"prior": self.prior} if self.prior is not None else {}), "labels": self.labels}

    @property
    def sentence(self) -> str:
        """The one-line verdict (:func:`verdict_line` of :attr:`record`), labels included."""
        return verdict_line(self.record)


def verdict_line(verdict: dict[str, Any]) -> str:
    """The verdict line of ``gi run`` / ``gi attack`` from ``metrics.json``'s ``verdict`` record: ``verdict:
    <word>: <sentence>``, with truth the mismatch sentence after it, then the feature sentence where features were
    matched, the prior-filled input values (:func:`prior_summary`), and without truth the labels
    (:func:`labels_phrase`)."""
    line = f"verdict: {verdict['overall']}: {verdict['summary']}"
    if "gradient" in verdict:
        line += f"; {verdict['gradient']['summary']}"
    if "features" in verdict:
        line += f"; {verdict['features']['summary']}"
    if "prior" in verdict:
        line += f"; {verdict['prior']['summary']}"
    if "labels" in verdict:
        line += f"; {labels_phrase(verdict['labels'])}"
    return line


def trivial_guesses(images: torch.Tensor) -> dict[str, torch.Tensor]:
    """The two trivial guesses of ``images`` (B, C, H, W) in [0, 1]: ``grey`` (0.5 everywhere) and
    ``mean_colour`` (each image's per-channel mean, constant over the pixels)."""
    import torch

    x = images.detach().float().clamp(0, 1)
    return {"grey": torch.full_like(x, 0.5), "mean_colour": x.mean((2, 3), keepdim=True).expand_as(x).contiguous()}


def trivial_baselines(images: torch.Tensor) -> dict[str, list[float]]:
    """PSNR and SSIM of each trivial guess against ``images``, per image: ``grey_psnr``, ``grey_ssim``,
    ``mean_colour_psnr``, ``mean_colour_ssim`` (:mod:`gi.analysis.metrics`, the same scores as the
    reconstructions')."""
    from gi.analysis.metrics import psnr, ssim

    out: dict[str, list[float]] = {}
    for name, guess in trivial_guesses(images).items():
        out[f"{name}_psnr"] = [float(v) for v in psnr(guess, images)]
        out[f"{name}_ssim"] = [float(v) for v in ssim(guess, images)]
    return out


__all__ = [
    "ANALYTIC", "CALIBRATIONS", "COSINE", "ESTIMATES", "ESTIMATE_RULE", "EVIDENCE_KINDS", "GRADIENT", "UNDECIDED",
    "UNMATCHED", "UPDATE", "Calibration", "estimate_sentence", "evidence_kind", "image_estimate", "image_estimates",
    "AttackVerdict", "CANNOT_TELL", "DOES_NOT_EXPLAIN", "EXPLAINED_BELOW", "EXPLAINS", "IMAGE_VERDICTS",
    "MAX_LABELS_SHOWN", "MISMATCH_VERDICTS", "NOT_PINNED", "NOT_RECOVERED", "NOT_RECOVERED_MARGIN_DB", "PARTIAL",
    "PARTLY_EXPLAINS", "PINNED_FLOOR", "PINNED_RATIO", "RECOVERED", "RECOVERED_MARGIN_DB", "RECOVERED_MIN_PSNR_DB",
    "SLOT_VERDICTS", "UNEXPLAINED_FROM", "UNKNOWN_ORDER", "best_guess", "feature_summary", "image_sentence",
    "image_summary", "image_verdict", "labels_phrase", "mismatch_phrase", "mismatch_sentence", "mismatch_summary",
    "mismatch_verdict", "moves_share", "overall", "prior_summary", "slot_sentence", "slot_verdict", "slot_verdicts",
    "tally", "trivial_baselines", "trivial_guesses", "verdict_line",
]
