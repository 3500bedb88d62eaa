"""The verdict rule of gi/analysis/verdict.py (docs/usage.md, "Verdict"): exact on values far from the thresholds,
the trivial guesses scored as the baselines are, and the mismatch words."""

from __future__ import annotations

import math

import pytest
import torch

from gi.analysis.metrics import psnr, score
from gi.analysis.verdict import (
    DOES_NOT_EXPLAIN,
    EXPLAINED_BELOW,
    EXPLAINS,
    NOT_PINNED,
    NOT_RECOVERED,
    NOT_RECOVERED_MARGIN_DB,
    PARTIAL,
    PARTLY_EXPLAINS,
    PINNED_FLOOR,
    PINNED_RATIO,
    RECOVERED,
    RECOVERED_MARGIN_DB,
    RECOVERED_MIN_PSNR_DB,
    UNEXPLAINED_FROM,
    feature_summary,
    image_sentence,
    image_summary,
    image_verdict,
    mismatch_phrase,
    mismatch_summary,
    mismatch_verdict,
    overall,
    prior_summary,
    slot_verdict,
    trivial_baselines,
    trivial_guesses,
)


def _images(b: int = 3) -> torch.Tensor:
    return torch.rand(b, 3, 16, 16, generator=torch.Generator().manual_seed(b))


def test_the_thresholds_are_the_documented_ones():
    assert (NOT_RECOVERED_MARGIN_DB, RECOVERED_MIN_PSNR_DB, RECOVERED_MARGIN_DB) == (1.0, 25.0, 10.0)
    assert EXPLAINED_BELOW < UNEXPLAINED_FROM


@pytest.mark.parametrize(("psnr_db", "trivial", "want"), [
    (9.0, 14.0, NOT_RECOVERED),  # below the trivial guess
    (14.0, 14.0, NOT_RECOVERED),  # the trivial guess itself
    (14.5, 14.0, NOT_RECOVERED),  # within the margin
    (18.0, 14.0, PARTIAL),  # well above the guess, far from 25 dB
    (23.0, 10.0, PARTIAL),  # 13 dB above the guess but under 25 dB
    (40.0, 14.0, RECOVERED),
    (111.0, 14.8, RECOVERED),  # the analytic answer
    (math.inf, 14.0, RECOVERED),  # identical images
    (30.0, 24.0, PARTIAL),  # a flat image: 30 dB is only 6 dB above its mean colour
    (24.5, 24.0, NOT_RECOVERED),  # ... and 24.5 dB no better than it
    (40.0, 24.0, RECOVERED),
    (math.nan, 14.0, NOT_RECOVERED),
])
def test_image_verdict(psnr_db, trivial, want):
    assert image_verdict(psnr_db, trivial) == want


@pytest.mark.parametrize(("mismatch", "want"), [
    (0.0, EXPLAINS), (1e-6, EXPLAINS), (0.8, DOES_NOT_EXPLAIN), (5.0, DOES_NOT_EXPLAIN), (math.inf, DOES_NOT_EXPLAIN),
    (math.nan, DOES_NOT_EXPLAIN), (math.sqrt(EXPLAINED_BELOW * UNEXPLAINED_FROM), PARTLY_EXPLAINS),
])
def test_mismatch_verdict(mismatch, want):
    assert mismatch_verdict(mismatch) == want


def test_the_mean_colour_guess_scores_as_its_baseline_and_is_not_recovered():
    images = _images()
    base = trivial_baselines(images)
    guess = trivial_guesses(images)["mean_colour"]
    scored = score(guess, images, match=False)
    assert scored["psnr"] == pytest.approx(base["mean_colour_psnr"], abs=1e-9)
    assert scored["ssim"] == pytest.approx(base["mean_colour_ssim"], abs=1e-9)
    assert [float(v) for v in psnr(torch.full_like(images, 0.5), images)] == base["grey_psnr"]
    # the mean colour is the best constant image: never below the grey one
    assert all(m >= g for m, g in zip(base["mean_colour_psnr"], base["grey_psnr"]))
    summary = image_summary(scored["psnr"], base["grey_psnr"], base["mean_colour_psnr"])
    assert summary["images"] == [NOT_RECOVERED] * 3 and summary["overall"] == NOT_RECOVERED
    assert summary["best_trivial_guess"] == ["mean_colour"] * 3
    assert summary["summary"] == ("0 of 3 images recovered, 3 not recovered (at most 1 dB above the best trivial "
                                  "guess: each image's mean colour)")


def test_the_run_verdict_counts_and_words():
    verdicts = [RECOVERED] * 3 + [PARTIAL] + [NOT_RECOVERED] * 6
    assert image_sentence(verdicts, ["mean_colour"] * 10) == (
        "3 of 10 images recovered, 1 partial (above the best trivial guess, short of recovered), 6 not recovered "
        "(at most 1 dB above the best trivial guess: each image's mean colour)")
    assert image_sentence([RECOVERED], ["grey"]) == "1 of 1 image recovered"
    assert "the better of a flat grey image and the image's mean colour" in image_sentence(
        [NOT_RECOVERED] * 2, ["grey", "mean_colour"])
    assert overall(verdicts) == PARTIAL and overall([RECOVERED] * 2) == RECOVERED
    assert overall([NOT_RECOVERED]) == NOT_RECOVERED and overall([PARTIAL, NOT_RECOVERED]) == PARTIAL
    summary = image_summary([40.0, 18.0, 12.0], [12.0, 12.0, 12.0], [14.0, 14.0, 14.0])
    assert summary["counts"] == {RECOVERED: 1, PARTIAL: 1, NOT_RECOVERED: 1}
    assert summary["images"] == [RECOVERED, PARTIAL, NOT_RECOVERED]


def test_mismatch_words():
    assert mismatch_phrase(0.81) == "the reconstruction does not explain the gradient (relative mismatch 0.81)"
    assert mismatch_phrase(1e-6, "update") == "the reconstruction explains the update (relative mismatch 1e-06)"
    one = mismatch_summary([1e-6])
    assert one["overall"] == EXPLAINS and one["captures"] == [EXPLAINS] and one["gradient_mismatch"] == [1e-6]
    many = mismatch_summary([1e-6, 0.5, 0.9])
    assert many["overall"] == PARTLY_EXPLAINS
    assert many["counts"] == {EXPLAINS: 1, PARTLY_EXPLAINS: 0, DOES_NOT_EXPLAIN: 2}
    assert many["summary"] == ("the reconstruction explains the gradient of 1 of 3 captures, does not explain it "
                               "for 2 (relative mismatch 1e-06 to 0.9)")
    assert mismatch_summary([0.28, 0.31], "update")["summary"] == (
        "the reconstruction does not explain the update of 2 of 2 captures (relative mismatch 0.28 to 0.31)")
    nan = float("nan")  # a capture that shares no gradient has nothing to explain: out of the range, counted
    assert mismatch_summary([1e-6, nan])["summary"] == (
        "the reconstruction explains the gradient of 1 of 2 captures, does not explain it for 1 (relative mismatch "
        "1e-06 to 1e-06; 1 capture(s) share no gradient)")
    assert mismatch_summary([nan, nan])["summary"].endswith("(no mismatch measured)")
    assert mismatch_phrase(nan) == "the reconstruction does not explain the gradient (no mismatch measured)"


def test_a_capture_that_cannot_be_re_simulated_reads_cannot_tell():
    """A round of reshuffled mini-batches: its update is not re-simulated by the images alone, so no mismatch word
    is given for it, whatever the mismatch; the captures that can be re-simulated keep theirs."""
    from gi.analysis.verdict import CANNOT_TELL, UNKNOWN_ORDER

    assert mismatch_verdict(1e-9, known=False) == mismatch_verdict(0.9, known=False) == CANNOT_TELL
    one = mismatch_summary([0.35], "update", known=[False])
    assert one["overall"] == CANNOT_TELL and one["captures"] == [CANNOT_TELL]
    assert one["counts"] == {EXPLAINS: 0, PARTLY_EXPLAINS: 0, DOES_NOT_EXPLAIN: 0, CANNOT_TELL: 1}
    assert one["summary"] == f"cannot tell whether the reconstruction explains the update: {UNKNOWN_ORDER}"
    mixed = mismatch_summary([1e-6, 0.35], "update", known=[True, False])
    assert mixed["overall"] == EXPLAINS and mixed["captures"] == [EXPLAINS, CANNOT_TELL]
    assert mixed["summary"].startswith("the reconstruction explains the update of 1 of 1 captures (relative "
                                       "mismatch 1e-06 to 1e-06); cannot tell for 1 more")
    assert mismatch_summary([0.35, 0.4], "update", known=[False, False])["overall"] == CANNOT_TELL
    assert "cannot tell" not in mismatch_summary([0.35], "update")["summary"]  # known by default


def test_feature_words():
    """The features record: per capture the residual's word under the mismatch thresholds, the images' feature
    mismatch as a number, and a layer whose gradient is not shared left unjudged."""
    rec = feature_summary("body.1", [4.1e-8, 2e-8, 0.5], [0.081, 0.15, 0.4])
    assert rec["targets"] == [EXPLAINS, EXPLAINS, DOES_NOT_EXPLAIN]
    assert rec["summary"] == ("the feature target (the inputs of body.1) explains that layer's gradient for 2 of 3 "
                              "captures; does not explain that layer's gradient for 1 of 3 captures (residual at "
                              "most 0.5); the images reproduce them to a relative mismatch of 0.081 to 0.4")
    one = feature_summary("fc", [1e-9], [0.02])
    assert one["summary"] == ("the feature target (the inputs of fc) explains that layer's gradient for 1 of 1 "
                              "captures (residual at most 1e-09); the images reproduce them to a relative mismatch "
                              "of 0.02")
    unshared = feature_summary("fc", [None], [None])
    assert unshared["targets"] == [None] and "not shared" in unshared["summary"]
    assert "reproduce" not in unshared["summary"]


def test_a_target_its_search_is_not_sure_of_is_said_beside_the_residual():
    """Any basis of a layer's row space explains its gradient, so a target the input search is sure of only in
    part is said so, whatever the residual."""
    rec = feature_summary("body.1", [4e-6, 3e-6], [0.1, 0.2], sure=[[83, 100], None])
    assert rec["targets"] == [EXPLAINS, EXPLAINS] and rec["target_sure"] == [[83, 100], None]
    assert rec["summary"] == ("the feature target (the inputs of body.1) explains that layer's gradient for 2 of 2 "
                              "captures (residual at most 4e-06); its search is sure of only 83 of 100 rows (1 of 2 "
                              "captures): the others are its best guesses, which the residual cannot tell from "
                              "inputs; the images reproduce them to a relative mismatch of 0.1 to 0.2")
    assert "sure" not in feature_summary("body.1", [4e-6], [0.1], sure=[None])["summary"]
    assert feature_summary("body.1", [4e-6], [0.1])["target_sure"] == [None]


def test_prior_filled_pixels_are_counted_per_capture_and_said():
    """The prior record: the spread of the input values the walk leaves to the prior over the captures it filled,
    out of their size; None (no record) where it filled none."""
    rec = prior_summary("body.0", [499, None, 1001], [3072, None, 3072])
    assert rec["free"] == [499, None, 1001] and rec["layer"] == "body.0"
    assert rec["summary"] == ("the image prior fills at least 499 to 1001 of the 3072 input values (body.0) of 2 of 3 "
                              "captures: the capture's equations do not determine them")
    assert "at least 615 of the 3072" in prior_summary("body.0", [615], [3072])["summary"]
    assert prior_summary("body.0", [None, None], [None, None]) is None


def test_the_labels_phrase_names_each_capture_s_slot_labels_up_to_a_bound():
    from gi.analysis.verdict import MAX_LABELS_SHOWN, labels_phrase

    assert labels_phrase([[3]]) == "recovered label 3"
    assert labels_phrase([[0, 0, 2, 7]]) == "recovered labels 0, 0, 2, 7"
    many = [[k] for k in range(MAX_LABELS_SHOWN + 2)]
    phrase = labels_phrase(many)
    assert phrase.startswith("recovered labels per capture: 0: 0; 1: 1; ")
    assert f"{MAX_LABELS_SHOWN - 1}: {MAX_LABELS_SHOWN - 1}; 2 more capture(s)" in phrase
    assert f"{MAX_LABELS_SHOWN}: " not in phrase


@pytest.mark.parametrize(("mismatch", "swap", "want"), [
    (2e-4, 0.07, EXPLAINS),  # a recovered slot of the sigmoid LeNet's batch: the swap moves the share 350x the residual
    (2e-4, 2.5e-3, NOT_PINNED),  # a noise slot of the same batch: 12x, the mean colour there would still read well
    (2e-4, 0.0, NOT_PINNED),  # a slot already at its mean colour
    (5e-3, 0.15, PARTLY_EXPLAINS),  # 30x
    (1e-2, 0.11, NOT_PINNED),  # a failed slot of a batch that partly explains its gradient: 11x
    (1e-6, 1e-3, EXPLAINS),  # an exact answer on a net whose gradient barely depends on the images
    (0.0, 1e-6, NOT_PINNED),  # under the float32 floor: nothing to tell apart
    (0.5, 1e-4, DOES_NOT_EXPLAIN),  # a capture that does not explain its share: every slot
    (2e-4, None, EXPLAINS), (2e-4, math.nan, EXPLAINS),  # not measured: the capture's word
])
def test_slot_verdict(mismatch, swap, want):
    assert slot_verdict(mismatch, swap) == want
    assert PINNED_RATIO > 1 and PINNED_FLOOR < EXPLAINED_BELOW


def test_a_batch_with_slots_its_capture_does_not_pin_never_reads_explains():
    """The batch of 8 with two noise images that read ``explains`` at 2e-4: per slot it says which are not pinned,
    and the run's word falls to ``partly explains``."""
    from gi.analysis.verdict import CANNOT_TELL

    swaps = [0.097, 0.084, 0.094, 0.070, 2.5e-3, 1.1e-3, 0.093, 0.097]
    rec = mismatch_summary([8.6e-6, 2.0e-4], swaps=[[0.06] * 8, swaps])
    assert rec["captures"] == [EXPLAINS, EXPLAINS]
    assert rec["slots"] == [[EXPLAINS] * 8, [EXPLAINS] * 4 + [NOT_PINNED] * 2 + [EXPLAINS] * 2]
    assert rec["overall"] == PARTLY_EXPLAINS
    assert rec["summary"].endswith("; 2 of 16 images are not pinned by their capture: it reads about the same with "
                                   "each replaced by its own mean colour")
    assert rec["slot_swap_distance"][1] == swaps
    pinned = mismatch_summary([8.6e-6], swaps=[[0.06] * 8])
    assert pinned["overall"] == EXPLAINS and "pinned" not in pinned["summary"]
    assert mismatch_summary([2e-4], swaps=[[0.07, 1e-3]])["summary"].endswith(
        "; 1 of 2 images is not pinned by its capture: it reads about the same with it replaced by its own mean "
        "colour")
    assert mismatch_summary([8.6e-6])["slots"] == [None]  # not measured: no word per slot
    assert mismatch_summary([0.35], "update", known=[False], swaps=[None])["overall"] == CANNOT_TELL


@pytest.mark.parametrize(("kind", "mismatch", "swap", "want"), [
    # an optimisation against a FedSGD gradient (the sigmoid LeNet's batches)
    ("gradient-l2", 2e-4, 0.07, RECOVERED),  # pinned 350x, under 1e-3
    ("gradient-l2", 2e-4, 5e-4, NOT_RECOVERED),  # 2.5x: the capture barely tells the image from its mean colour
    ("gradient-l2", 2e-4, 2e-3, "undecided"),  # 10x: between the measured groups (partial images reach 5.5x)
    ("gradient-l2", 5e-3, 1.0, "undecided"),  # pinned, but the mismatch is between the thresholds
    ("gradient-l2", 0.05, 1.0, NOT_RECOVERED),  # at or above the failure threshold: every slot
    ("gradient-l2", 0.05, None, NOT_RECOVERED), ("gradient-l2", 2e-4, None, "undecided"),  # no swap: none rests on it
    ("gradient-l2", 1e-7, 5e-6, NOT_RECOVERED),  # a ratio of 50 under the float32 floor: nothing to tell apart
    # the analytic walk's direct answer: no failure measured among them, so no failure threshold or loose ratio
    ("analytic", 1e-4, 0.5, RECOVERED), ("analytic", 0.05, 0.5, "undecided"), ("analytic", 1e-4, 1e-4, "undecided"),
    # the angle fit (ResNet-18), a shared update and a fit that never matched the share: their groups overlap, so
    # nothing is said; an objective without a calibration neither
    ("gradient-cosine", 1e-5, 1.0, "undecided"), ("gradient-cosine", 0.5, 1e-6, "undecided"),
    ("gradient-l1", 1e-5, 1.0, "undecided"),
    ("update", 1e-5, 1.0, "undecided"), ("update", 0.5, 1e-6, "undecided"),
    ("unmatched", 1e-5, 1.0, "undecided"), ("unmatched", 0.4, 0.3, "undecided"),
    (None, 1e-5, 1.0, "undecided"), ("no such kind", 1e-5, 1.0, "undecided"),  # not recorded / not calibrated
])
def test_image_estimate_by_evidence_kind(kind, mismatch, swap, want):
    from gi.analysis.verdict import image_estimate

    assert image_estimate(mismatch, swap, kind) == want


def test_image_estimate_without_a_mismatch_or_a_re_simulation():
    """A NaN mismatch (a capture sharing nothing, answered by a flat grey image) is not recovered whatever the kind;
    a capture that cannot be re-simulated is undecided whatever its numbers."""
    from gi.analysis.verdict import EVIDENCE_KINDS, UNDECIDED, image_estimate

    for kind in (*EVIDENCE_KINDS, None):
        assert image_estimate(math.nan, 0.5, kind) == NOT_RECOVERED
        assert image_estimate(1e-6, 0.5, kind, known=False) == UNDECIDED


def test_the_calibrations_are_ordered_and_cover_every_kind():
    """Every evidence kind has an entry; where both thresholds are placed the recovered one is the lower, and a
    loose ratio sits under the pinned one (else a slot could be both)."""
    from gi.analysis.verdict import CALIBRATIONS, EVIDENCE_KINDS

    assert set(CALIBRATIONS) == set(EVIDENCE_KINDS)
    for cal in CALIBRATIONS.values():
        if cal.recovered_below is not None and cal.failed_from is not None:
            assert cal.recovered_below < cal.failed_from
        if cal.loose_below is not None:
            assert 1 <= cal.loose_below < PINNED_RATIO
        assert cal.measured


def test_evidence_kind():
    from gi.analysis.verdict import ANALYTIC, COSINE, GRADIENT, UNMATCHED, UPDATE, evidence_kind

    assert evidence_kind(True, True, False) == ANALYTIC and evidence_kind(True, False, True) == ANALYTIC
    assert evidence_kind(False, False, False) == UNMATCHED and evidence_kind(False, False, True) == UNMATCHED
    assert evidence_kind(False, True, False) == GRADIENT and evidence_kind(False, True, True) == UPDATE
    assert evidence_kind(False, True, False, "cosine") == COSINE
    assert evidence_kind(False, True, True, "cosine") == UPDATE
    assert evidence_kind(False, True, False, "l1") == "gradient-l1"  # no calibration: its images read undecided


def test_the_record_estimates_each_slot_by_its_capture_s_kind():
    """Two captures: a batch of 4 optimised against its gradient (two slots pinned, one loose, one between) and a
    4-step update (nothing said); the record, the counts and the sentence's clause."""
    from gi.analysis.verdict import UNDECIDED, AttackVerdict

    rec = mismatch_summary([2e-4, 0.07], swaps=[[0.07, 0.06, 4e-4, 2e-3], [0.3, 0.2, 0.4, 0.1]],
                           kinds=["gradient-l2", "update"], sizes=[4, 4])
    assert rec["estimates"] == [[RECOVERED, RECOVERED, NOT_RECOVERED, UNDECIDED], [UNDECIDED] * 4]
    assert rec["evidence"] == ["gradient-l2", "update"]
    assert rec["estimate_counts"] == {RECOVERED: 2, NOT_RECOVERED: 1, UNDECIDED: 5}
    assert rec["summary"].endswith("; by the capture's own evidence 2 of 8 images recovered, 1 not recovered, "
                                   "5 undecided")
    assert AttackVerdict(rec, None, [[0] * 4, [0] * 4]).estimates == rec["estimates"]
    # a capture whose slots were not swapped (a round whose order is unknown) has its size of undecided slots
    rnd = mismatch_summary([0.35], "update", known=[False], swaps=[None], kinds=["update"], sizes=[3])
    assert rnd["estimates"] == [[UNDECIDED] * 3]
    plain = mismatch_summary([2e-4], swaps=[[0.07]])
    assert "estimates" not in plain and "own evidence" not in plain["summary"]
    assert AttackVerdict(plain, None, [[0]]).estimates is None
