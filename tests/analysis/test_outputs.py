"""The rows and captions of an output directory (gi/analysis/outputs.py): in a batch each truth image is shown
with the label its pixel-matched reconstruction slot was reconstructed with, named as such, and whether its true
label is among the capture's slot labels at all."""

from __future__ import annotations

import torch

from gi.analysis.outputs import plain_table, truth_table
from gi.analysis.verdict import RECOVERED
from gi.attack.recon import Reconstruction
from gi.attack.stages import AttackResult, LabelConfig
from gi.capture import Truth

C = 10


def _outcome(images: torch.Tensor, slots: list[int], mismatch: float, swaps: list[float] | None = None
             ) -> AttackResult:
    labels = torch.nn.functional.one_hot(torch.tensor(slots), C).float()
    history = {"gradient_mismatch": mismatch} | ({} if swaps is None else {"slot_swap_distance": swaps})
    rec = Reconstruction(images=images, all_images=images[None], labels=labels, objective=torch.zeros(1),
                         best_restart=0, history=history)
    return AttackResult([None], "fixed", [None], [rec], [{"name": "labels", "method": "test", "why": None}])


def test_batch_rows_give_the_matched_slot_s_label_and_whether_the_true_label_was_recovered():
    """Truth labels 3, 6, 7; slots reconstructed with labels 3, 6, 6 whose images are truths 1, 0, 2 (a little
    noise): truth 0 (label 3) matches slot 1 (label 6), truth 1 (6) slot 0 (3), truth 2 (7) slot 2 (6); no slot
    has label 7."""
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(3, 3, 32, 32, generator=gen)
    true = torch.tensor([3, 6, 7])
    truth = Truth(images=images, labels=true, targets=torch.nn.functional.one_hot(true, C).float(),
                  counts=torch.bincount(true, minlength=C), meta={"indices": [10, 11, 12]})
    shown = (images[[1, 0, 2]] + 0.003 * torch.randn(3, 3, 32, 32, generator=gen)).clamp(0, 1)
    table = truth_table(_outcome(shown, [3, 6, 6], 0.5), [truth], LabelConfig(), 0, {"match": True,
                                                                                      "lpips_vgg": False})
    got = [(r["dataset_index"], r["true_label"], r["matched_slot"], r["slot_label"], r["true_label_in_slots"])
           for r in table.rows]
    assert got == [(10, 3, 1, 6, True), (11, 6, 0, 3, True), (12, 7, 2, 6, False)]
    assert "recovered_label" not in table.rows[0]
    assert all(r["verdict"] == RECOVERED and r["psnr"] > 40 for r in table.rows)
    assert all(r["mean_colour_psnr"] >= r["grey_psnr"] for r in table.rows)
    assert all(r["gradient_mismatch"] == 0.5 and r["mismatch_verdict"] == "does not explain" for r in table.rows)
    assert table.captions[0].endswith(" dB recovered\nslot: 6\ntrue: 3")
    assert table.captions[2].endswith("\nslot: 6\ntrue: 7 (no slot)")


def test_rows_without_truth_give_the_slot_label_and_the_capture_s_mismatch():
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    table = plain_table(_outcome(images, [3, 6], 1e-6))
    assert [(r["slot_label"], r["mismatch_verdict"]) for r in table.rows] == [(3, "explains"), (6, "explains")]
    assert table.captions == ["slot label 3\nmismatch 1e-06", "slot label 6\nmismatch 1e-06"]


def test_captions_name_the_classes_where_the_dataset_has_names():
    from gi.world.classes import CIFAR10_CLASSES
    from gi.world.data import class_names

    assert class_names("cifar10-samples") == CIFAR10_CLASSES and class_names("fashion-mnist")[9] == "Ankle boot"
    assert class_names("folder") == [] and class_names("no-such-set") == []
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    true = torch.tensor([3, 6])
    truth = Truth(images=images, labels=true, targets=torch.nn.functional.one_hot(true, C).float(),
                  counts=torch.bincount(true, minlength=C))
    table = truth_table(_outcome(images, [3, 6], 0.5), [truth], LabelConfig(), 0, {"match": True,
                                                                                   "lpips_vgg": False},
                        classes=CIFAR10_CLASSES)
    assert table.captions[1].endswith("\nslot: 6 frog\ntrue: 6 frog")
    assert plain_table(_outcome(images, [3, 6], 1e-6), CIFAR10_CLASSES).captions[0].startswith("slot label 3 cat\n")


def test_each_row_carries_its_own_slot_s_word_where_the_slots_were_swapped():
    """A capture that explains its gradient (2e-4) with slot 1 not pinned (its swap moves the share 1e-3): without
    truth the slot's row reads ``not pinned``; with truth the row of the truth image matched to that slot does."""
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    plain = plain_table(_outcome(images, [3, 6], 2e-4, [0.07, 1e-3]))
    assert [r["mismatch_verdict"] for r in plain.rows] == ["explains", "not pinned"]
    true = torch.tensor([6, 3])
    truth = Truth(images=images[[1, 0]], labels=true, targets=torch.nn.functional.one_hot(true, C).float(),
                  counts=torch.bincount(true, minlength=C), meta={})
    rows = truth_table(_outcome(images, [3, 6], 2e-4, [0.07, 1e-3]), [truth], LabelConfig(), 0,
                       {"match": True, "lpips_vgg": False}).rows
    assert [(r["matched_slot"], r["mismatch_verdict"]) for r in rows] == [(1, "not pinned"), (0, "explains")]
