"""When the analytic walk polishes its image through the whole body (fcn_analytic.invert.polishable). What the
polish does to a ReLU LeNet's image: tests/fcn_analytic/test_prior.py and tests/experiments/test_attack.py."""

from __future__ import annotations

from fcn_analytic.invert import DETERMINED_TOL, LayerReport, determined, polishable


def _report(name: str, route: str, residual: float, forward: float | None = 0.0, unique: bool = True,
            filled: bool = False) -> LayerReport:
    return LayerReport(name, route, 10, 10, residual, forward, False, unique, filled)


FC = _report("fc", "label-result", 1e-7, None)
CONV3 = _report("body.4", "least-squares (cholesky)", 2e-5)
CONV2 = _report("body.2", "least-squares (cholesky)", 4e-4)
CONV2_RANK_DEFICIENT = _report("body.2", "least-squares (lstsq)", 4e-4, unique=False)
INPUT_PRIOR = _report("body.0", "least-squares (lstsq) + TV prior (1200 rows < 3072 unknowns)", 2e-4, unique=False,
                      filled=True)
INPUT_EXACT = _report("body.0", "least-squares (cholesky)", 1e-6)


def test_a_layer_is_determined_by_a_full_rank_solve_below_the_tolerance():
    assert determined(CONV3) and determined(FC)
    assert not determined(CONV2_RANK_DEFICIENT)  # a minimum-norm answer is one point of an affine set
    assert not determined(INPUT_PRIOR)
    assert not determined(_report("body.4", "least-squares (cholesky)", DETERMINED_TOL))
    assert not determined(_report("body.4", "least-squares (cholesky)", 1e-6, forward=2 * DETERMINED_TOL))


def test_the_polish_runs_only_for_a_prior_filled_input_under_determined_layers():
    assert polishable([FC, CONV3, CONV2, INPUT_PRIOR])
    assert not polishable([FC, CONV3, CONV2, INPUT_EXACT])  # nothing to fill: the walk is exact
    assert not polishable([FC, CONV3, CONV2_RANK_DEFICIENT, INPUT_PRIOR])  # the layers above do not pin the image
    assert not polishable([_report("fc", "label-result", 0.3, None), CONV3, CONV2, INPUT_PRIOR])
    assert polishable([FC, INPUT_PRIOR])  # one conv under the fc: the fc input is its output
