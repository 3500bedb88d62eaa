"""docs/architecture.md "How to add", "An attack stage": a stage is one registered function, run in its order
before or after the reconstruction, and its record lands in the result's ``stages``."""

from __future__ import annotations

import pytest

import gi.attack
from gi.attack.stages import FEATURES, RECONSTRUCT, STAGES, PreparedAttack, register_stage
from tests.factories import fedsgd_capture, tiny_cnn


@pytest.fixture
def recipe_stages():
    """The recipe's two stages, registered for one test: one between the features and the reconstruction, one
    after it."""
    ran: list[tuple[str, int]] = []

    @register_stage("count-captures", FEATURES + 50)
    def count_captures(job: PreparedAttack) -> dict:
        """A no-op stage: records that it ran and what it saw."""
        ran.append(("count-captures", len(job.captures)))
        job.notes["counted"] = len(job.captures)
        return {"captures": len(job.captures), "labels_known": job.label_results[0] is not None}

    @register_stage("after-fit", RECONSTRUCT + 100)
    def after_fit(job: PreparedAttack) -> dict:
        ran.append(("after-fit", len(job.reconstructions)))
        return {"counted_before": job.notes["counted"], "reconstructions": len(job.reconstructions)}

    try:
        yield ran
    finally:
        STAGES.pop("count-captures")
        STAGES.pop("after-fit")


def test_a_registered_stage_runs_in_its_place_and_records(recipe_stages):
    capture, _ = fedsgd_capture(tiny_cnn(4, seed=0), 1, 0, 4)
    result = gi.attack.run(capture, preset="default", labels="idlg", iterations=3, restarts=1, analytic=False,
                           progress=False)
    assert recipe_stages == [("count-captures", 1), ("after-fit", 1)]
    names = [s["name"] for s in result.stages]
    assert names == ["labels", "features", "count-captures", "reconstruct", "after-fit"]
    assert result.stages[2] == {"name": "count-captures", "captures": 1, "labels_known": True}
    assert result.stages[4] == {"name": "after-fit", "counted_before": 1, "reconstructions": 1}


def test_a_stage_place_and_name_are_unique():
    with pytest.raises(ValueError, match="place is taken"):
        register_stage("another-labels", STAGES["labels"].order)(lambda job: {})
    with pytest.raises(ValueError, match="place is taken"):
        register_stage("fit", RECONSTRUCT)(lambda job: {})
    with pytest.raises(ValueError, match="registered twice"):
        register_stage("labels", 1.0)(lambda job: {})
    assert [s.name for s in sorted(STAGES.values(), key=lambda s: s.order)] == ["labels", "features"]
