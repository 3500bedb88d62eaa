"""The answer for a capture that shares nothing (:attr:`gi.capture.Capture.silent`: all-zero shared tensors), which
no stage attacks (docs/architecture.md "Data flow")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gi.attack.recon import Reconstruction
    from gi.capture import Capture
    from gi.label_result import LabelResult


SILENT_WHY = ("its shared tensors are all zero (the client's loss had no gradient, e.g. the net already predicts "
              "the true class with softmax 1.0): it carries no label or image information")


def silent_warning(positions: Sequence[int], total: int) -> str:
    """The warning of a run with captures that share nothing (:attr:`gi.capture.Capture.silent`)."""
    which = ", ".join(str(i) for i in positions)
    return (f"{len(positions)} of {total} capture(s) ({which}) not attacked: {SILENT_WHY}; each is answered by a "
            "flat grey image and uniform labels, scored as not recovered")


def silent_labels(capture: Capture) -> LabelResult:
    """The label result of a capture that shares nothing: no counts, ``ok=False``, the reason in ``info``."""
    import torch

    from gi.label_result import LabelResult

    return LabelResult.from_counts("none", torch.zeros(capture.num_classes, dtype=torch.long), ok=False,
                                   info={"reason": SILENT_WHY})


def silent_reconstruction(capture: Capture) -> Reconstruction:
    """The answer for a capture that shares nothing: a flat grey image (0.5) per image slot and uniform soft labels,
    what one knows without a capture; its ``gradient_mismatch`` is NaN (there is no gradient to explain)."""
    import torch

    from gi.attack.recon import Reconstruction
    from gi.attack.recon.problem import image_slots

    shape = (image_slots(capture), *(int(s) for s in capture.model_spec["in_shape"]))
    image = torch.full(shape, 0.5)
    soft = torch.full((shape[0], capture.num_classes), 1.0 / capture.num_classes)
    return Reconstruction(images=image, all_images=image[None], labels=soft, objective=torch.tensor([float("nan")]),
                          best_restart=0, history={"step": [], "objective": [], "warnings": [],
                                                   "answered_by": "nothing (all-zero gradient)",
                                                   "gradient_mismatch": float("nan")},
                          seconds=0.0, iterations=0, all_labels=soft[None])
