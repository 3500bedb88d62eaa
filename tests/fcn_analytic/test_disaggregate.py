"""fcn_analytic.disaggregate: a batch's per-sample inputs of a Linear layer from its summed gradient."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fcn_analytic.disaggregate import ConeProgram, factor_residual, linear_inputs, spanning
from gi.core.errors import GIError
from gi.world.data import load
from gi.world.fl.protocol import Protocol
from gi.world.fl.victim import capture_gradients
from gi.world.models import build


def _layer_gradient(batch: int, n: int = 120, m: int = 24, seed: int = 0, zeros: float = 0.5
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """∇W = Δ Xᵀ, ∇b = Δ 1 for nonnegative inputs with a fraction ``zeros`` of exact zeros and dense errors."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, n, generator=g, dtype=torch.float64)
    x[torch.rand(batch, n, generator=g) < zeros] = 0.0
    delta = torch.randn(batch, m, generator=g, dtype=torch.float64)
    return delta.T @ x, delta.sum(0), x, delta


def _matched_error(found: torch.Tensor, truth: torch.Tensor) -> float:
    """Largest relative error of each true row against its nearest found row (the order is free)."""
    dist = torch.cdist(truth, found)
    return float((dist.min(1).values / truth.norm(dim=1)).max())


def test_inputs_and_output_errors_are_recovered_exactly():
    grad_w, grad_b, x, delta = _layer_gradient(batch=5)
    got = linear_inputs(grad_w, grad_b, 5, samples=50_000, chunk=2_000)
    assert _matched_error(got.inputs, x) < 1e-9
    assert _matched_error(got.output_errors, delta) < 1e-9
    assert got.residual < 1e-10 and got.draws <= 50_000
    # the recovered pairs explain the gradient: Δ Xᵀ = ∇W, Δ 1 = ∇b
    assert torch.allclose(got.output_errors.T @ got.inputs, grad_w, atol=1e-10)


@settings(max_examples=6, deadline=None)
@given(batch=st.integers(2, 5), seed=st.integers(0, 1000))
def test_any_batch_of_sparse_nonnegative_inputs_is_recovered(batch, seed):
    """Recovered exactly when every input has the sparsity a candidate needs (``min_zeros``, default B − 1 + 20
    zeros among the coordinates some sample uses: a zero every sample shares tells no input apart), and a clear
    error otherwise. The generator misses that sparsity for ~4 % of its B = 2 batches (42 of the 4004 (batch,
    seed) pairs here, all B = 2), and the rule held on all 4004."""
    grad_w, grad_b, x, _ = _layer_gradient(batch, seed=seed)
    live = (x != 0).any(0)
    zeros = (x[:, live] < 1e-4 * x.amax(1, keepdim=True)).sum(1)  # linear_inputs' zero_tol, relative to each max
    if bool((zeros >= batch - 1 + 20).all()):
        got = linear_inputs(grad_w, grad_b, batch, samples=50_000, chunk=2_000, seed=seed)
        assert got.inputs.shape == x.shape and _matched_error(got.inputs, x) < 1e-8
    else:
        with pytest.raises(GIError, match=f"of {batch} inputs found"):
            linear_inputs(grad_w, grad_b, batch, samples=50_000, chunk=2_000, seed=seed)


@pytest.mark.parametrize("seed", [10, 211])
def test_an_input_with_too_few_zeros_of_its_own_is_an_error_not_a_wrong_input(seed):
    """B = 2 batches of the generator above whose second input has fewer than 21 zeros outside the zeros both
    share: no candidate with that input's support passes, so the search says so."""
    grad_w, grad_b, x, _ = _layer_gradient(2, seed=seed)
    live = (x != 0).any(0)
    assert int((x[:, live] == 0).sum(1).min()) < 21
    with pytest.raises(GIError, match="1 of 2 inputs found"):
        linear_inputs(grad_w, grad_b, 2, samples=50_000, chunk=2_000, seed=seed)


def test_factor_residual_is_zero_for_the_true_inputs_and_blind_to_row_sum_preserving_mixtures():
    """∇W = Δᵀ X, ∇b = Δᵀ 1: the true inputs explain both (with their errors or least-squares ones); a mixture M X
    explains ∇W always and ∇b exactly when M 1 = 1 (why the residual is necessary, not sufficient); inputs
    outside ∇W's row space do not explain it."""
    grad_w, grad_b, x, delta = _layer_gradient(batch=4)
    assert factor_residual(grad_w, grad_b, x, delta) < 1e-12
    assert factor_residual(grad_w, grad_b, x) < 1e-12
    g = torch.Generator().manual_seed(1)
    mix = torch.eye(4, dtype=torch.float64) + 0.3 * torch.rand(4, 4, generator=g, dtype=torch.float64)
    assert factor_residual(grad_w, None, mix @ x) < 1e-12  # the weight gradient alone cannot tell
    assert factor_residual(grad_w, grad_b, mix @ x) > 0.05  # the bias can: M 1 != 1
    keep = mix / mix.sum(1, keepdim=True)  # rows summing to one: M 1 = 1
    assert factor_residual(grad_w, grad_b, keep @ x) < 1e-10
    other = torch.rand(4, x.shape[1], generator=g, dtype=torch.float64)
    assert factor_residual(grad_w, grad_b, other) > 0.5
    with pytest.raises(GIError, match="factor_residual"):
        factor_residual(grad_w, grad_b, x[:, :-1])


def test_a_real_relu_cnn_batch_gives_its_fully_connected_inputs():
    """The zoo's BatchNorm CNN in train mode on 4 Fashion-MNIST images: the input of ``body.1`` (the max-pooled
    ReLU feature map, 1568-d) of every image, from the captured float32 gradient."""
    data = load("fashion-mnist")
    model = build("cnn", 10, activation="relu", in_shape=(1, 28, 28), seed=0, batch_norm=True, channels=[16, 32],
                  hidden=64)
    images, labels = data.images[:4], data.labels[:4]
    capture, _ = capture_gradients(model, images, labels, Protocol(batch_size=4, model_mode="train"))
    seen: dict[str, torch.Tensor] = {}
    hook = model.body[1].register_forward_hook(lambda mod, inp, out: seen.__setitem__("x", inp[0].detach()))
    model.train()(images)
    hook.remove()
    got = linear_inputs(capture.gradients["body.1.weight"], capture.gradients["body.1.bias"], 4, chunk=5_000)
    assert _matched_error(got.inputs, seen["x"].double()) < 1e-3  # float32 gradient; exact up to its rounding
    assert got.residual < 1e-3


def test_vertices_find_inputs_too_dense_for_the_sampling():
    """Inputs with 10 % zeros at B = 8: a draw of 7 coordinates hits one input's zeros with odds 1e-7, so the
    sampling finds none in 20 000 draws; the vertices of {c : V c ≥ 0, 1ᵀ V c = 1} are exactly the inputs."""
    grad_w, grad_b, x, delta = _layer_gradient(batch=8, n=400, m=40, seed=3, zeros=0.1)
    with pytest.raises(GIError, match="of 8 inputs found"):
        linear_inputs(grad_w, grad_b, 8, samples=20_000, method="sample")
    got = linear_inputs(grad_w, grad_b, 8, method="lp")
    assert _matched_error(got.inputs, x) < 1e-8 and _matched_error(got.output_errors, delta) < 1e-8
    assert got.draws == 64 and got.residual < 1e-10  # 8·B programs, no sampling
    auto = linear_inputs(grad_w, grad_b, 8)
    assert torch.allclose(auto.inputs, got.inputs)


@pytest.mark.parametrize("simplex", ["dual", "primal"])
def test_cone_program_ends_on_the_vertex_each_objective_picks(simplex, capfd):
    """Rows e_1 … e_4 and their sum: the cross-section is the simplex {c ≥ 0, Σc = 1}, whose vertex minimising r·c
    is e_argmin(r), for every objective in turn, each warm-started from the last optimum; HiGHS prints nothing."""
    program = ConeProgram(torch.eye(4, dtype=torch.float64), simplex=simplex)
    g = torch.Generator().manual_seed(0)
    for r in torch.randn(12, 4, generator=g, dtype=torch.float64):
        assert torch.equal(program.minimise(r), torch.eye(4, dtype=torch.float64)[int(r.argmin())])
    assert capfd.readouterr().out == ""


def test_cone_program_without_an_optimum_says_none():
    """A cone that is not pointed (c₂ is free: one row, [1, 0]) has no lowest point along c₂."""
    program = ConeProgram(torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    assert program.minimise(torch.tensor([0.0, 1.0], dtype=torch.float64)) is None


def test_bad_inputs_are_clear_errors():
    grad_w, grad_b, x, delta = _layer_gradient(batch=3)
    with pytest.raises(GIError, match="bias gradient"):
        linear_inputs(grad_w, grad_b[:-1], 3)
    with pytest.raises(GIError, match="batch=1"):
        linear_inputs(grad_w, grad_b, 1)
    with pytest.raises(GIError, match="samples"):
        linear_inputs(grad_w, grad_b, 3, samples=0)
    with pytest.raises(GIError, match="method='simplex'; valid"):
        linear_inputs(grad_w, grad_b, 3, method="simplex")
    with pytest.raises(GIError, match="programs=0"):
        linear_inputs(grad_w, grad_b, 3, programs=0)
    twice = torch.cat([x[:2], x[:1]])  # two samples with the same input: rank 2 for a batch of 3
    with pytest.raises(GIError, match="rank < batch=3"):
        linear_inputs(delta.T @ twice, delta.sum(0), 3)
    dense = torch.rand(3, 120, dtype=torch.float64) + 0.1  # no zeros: nothing for the sampling to find
    with pytest.raises(GIError, match="0 of 3 inputs found"):
        linear_inputs(delta.T @ dense, delta.sum(0), 3, samples=4_000, chunk=2_000)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 12), st.integers(1, 4), st.integers(0, 10_000))
def test_spanning_keeps_one_direction_of_each_input_and_passes_over_near_copies(b, copies, seed):
    """B random unit directions (a basis) and ``copies`` near-copies of each (perturbed by 1e-3): the B picked are
    one per input, whatever the order the candidates come in."""
    gen = torch.Generator().manual_seed(seed)
    basis = torch.nn.functional.normalize(torch.randn(b, b, generator=gen, dtype=torch.float64), dim=1)
    while torch.linalg.svdvals(basis)[-1] < 0.05:  # a well-separated basis (the inputs of a batch)
        basis = torch.nn.functional.normalize(torch.randn(b, b, generator=gen, dtype=torch.float64), dim=1)
    near = basis.repeat(copies, 1) + 1e-3 * torch.randn(b * copies, b, generator=gen, dtype=torch.float64)
    candidates = torch.cat([basis, torch.nn.functional.normalize(near, dim=1)])
    owner = torch.arange(b).repeat(copies + 1)
    order = torch.randperm(len(candidates), generator=gen)
    picked = spanning(candidates[order], b)
    assert sorted(owner[order][picked].tolist()) == list(range(b))


def _visits(n_images: int = 6, epochs: int = 3, n: int = 200, m: int = 64, drift: float = 1e-2, seed: int = 0):
    """A synthetic multi-epoch sum ``Σ_visits δ_v x_vᵀ``: each image's E visits share its zeros (half of the
    entries) and differ by a random drift of relative size ``drift`` times the epoch on its support."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(n_images, n, generator=g, dtype=torch.float64) + 0.1
    base[torch.rand(n_images, n, generator=g) < 0.5] = 0.0
    scale = drift * base.mean(1, keepdim=True) * (base > 0)
    visits = torch.cat([base + e * scale * torch.randn(n_images, n, generator=g, dtype=torch.float64)
                        for e in range(epochs)]).clamp_min(0)
    delta = torch.randn(len(visits), m, generator=g, dtype=torch.float64)
    return delta.T @ visits, delta.sum(0), base


def test_row_space_is_the_span_of_every_visit():
    from fcn_analytic.disaggregate import row_space

    gw, _, base = _visits()
    basis = row_space(gw)
    assert basis.shape == (200, 18)  # 6 images × 3 epochs, each visit its own direction
    assert torch.allclose(basis.T @ basis, torch.eye(18, dtype=torch.float64), atol=1e-10)
    assert float((base - (base @ basis) @ basis.T).norm() / base.norm()) < 1e-10  # epoch 0's visits are in it


def test_null_directions_recover_an_input_from_its_zero_pattern_exactly():
    from fcn_analytic.disaggregate import null_directions, row_space

    gw, _, base = _visits(drift=0.0, epochs=1)
    basis = row_space(gw)
    pattern = base * 0.3 + (base > 0) * 5.0  # other values, the same zeros
    found, ratio = null_directions(basis, pattern)
    unit = torch.nn.functional.normalize(base, dim=1)
    assert torch.allclose(found, unit, atol=1e-9)  # unit, signed to a positive sum, the input itself
    assert bool((ratio < 1e-6).all())
    dense = torch.rand(6, 200, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 0.5
    dense[:, :20] = 0.0  # 20 zeros no input has in common: no direction of the span vanishes there
    assert bool((null_directions(basis, dense)[1] > 1e-3).all())
    with pytest.raises(GIError, match="a basis"):
        null_directions(basis, base[:, :10])


def test_the_pursuit_splits_a_mixture_that_its_zeros_leave_mixed():
    from fcn_analytic.disaggregate import null_directions, pursue, row_space

    g = torch.Generator().manual_seed(3)
    base = torch.rand(10, 200, generator=g, dtype=torch.float64) + 0.1
    base[torch.rand(10, 200, generator=g) < 0.3] = 0.0  # 30 % zeros: two inputs share 19
    basis = row_space(torch.randn(64, 10, generator=g, dtype=torch.float64) @ base)
    mix = (0.7 * base[0] + 0.3 * base[1])[None]
    unit = torch.nn.functional.normalize(base, dim=1)
    _, ratio = null_directions(basis, mix)  # its zeros: the 19 shared, where both inputs vanish
    assert float(ratio) > 0.1  # two directions vanish there: none singled out
    found = mix
    for _ in range(3):
        found, ratio = null_directions(basis, found, smallest=30)
    assert float((found @ unit.T)[0, 0]) > 1 - 1e-9 and float(ratio) < 1e-9  # the input that dominates, exactly
    pursued, pursued_ratio = pursue(basis, mix, 3, factor=3.0)  # 3·rank = the 30 smallest entries
    assert torch.equal(pursued, found) and torch.equal(pursued_ratio, ratio)
    assert torch.equal(pursue(basis, mix, 0)[0], mix)
    with pytest.raises(GIError, match="at least the basis' rank 10"):
        null_directions(basis, mix, smallest=9)
    with pytest.raises(GIError, match="at most the inputs' length 200"):
        null_directions(basis, mix, smallest=201)


def test_drifting_inputs_find_every_image_of_a_multi_epoch_sum():
    from fcn_analytic.disaggregate import drifting_inputs

    gw, gb, base = _visits()
    found = drifting_inputs(gw, gb, 6, seed=0)
    cos = torch.nn.functional.normalize(found.inputs, dim=1) @ torch.nn.functional.normalize(base, dim=1).T
    assert found.inputs.shape == (6, 200) and bool((found.inputs > -1e-9).all())
    assert bool((cos.max(0).values > 0.99).all())  # each image has its own input (measured > 0.999)
    assert len(set(cos.argmax(1).tolist())) == 6
    with pytest.raises(GIError, match="must be >= 2"):
        drifting_inputs(gw, gb, 1)
    with pytest.raises(GIError, match="of 6 inputs found in 2 programs"):  # two vertices cannot stand for six
        drifting_inputs(gw, gb, 6, programs=2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_pursuit_stops_rows_at_their_fixed_points_with_the_plain_iterations_answer(seed):
    from fcn_analytic.disaggregate import null_directions, pursue, row_space

    gw, _, x, _ = _layer_gradient(12, n=120, seed=seed)
    basis = row_space(gw)
    g = torch.Generator().manual_seed(seed)
    starts = torch.rand(16, 12, generator=g, dtype=torch.float64) @ x  # mixtures of the inputs
    plain, plain_ratio = starts, None
    for _ in range(30):
        plain, plain_ratio = null_directions(basis, plain, smallest=36)
    found, ratio = pursue(basis, starts, 30, factor=3.0)
    assert torch.equal(found, plain) and torch.equal(ratio, plain_ratio)


def test_pursued_inputs_recover_every_input_with_its_scale():
    from fcn_analytic.disaggregate import pursued_inputs

    gw, gb, x, delta = _layer_gradient(12, n=120, seed=0)
    found = pursued_inputs(gw, gb, 12)
    assert found.sure == 12
    assert _matched_error(found.inputs, x) < 1e-9 and _matched_error(found.output_errors, delta) < 1e-9
    assert found.residual < 1e-9


def test_pursued_inputs_are_sure_only_of_inputs():
    from fcn_analytic.disaggregate import pursued_inputs

    for batch, n, seed in ((20, 300, 0), (40, 600, 1)):  # 30 % zeros at B = 40: most pursuits end on no input
        gw, gb, x, _ = _layer_gradient(batch, n=n, m=2 * batch, seed=seed, zeros=0.5 if batch == 20 else 0.3)
        found = pursued_inputs(gw, gb, batch, rounds=2)
        unit = torch.nn.functional.normalize(x, dim=1)
        sure = torch.nn.functional.normalize(found.inputs[:found.sure], dim=1)
        assert bool(((sure @ unit.T).amax(1) > 1 - 1e-9).all())  # every row it is sure of is an input, exactly
        assert found.inputs.shape == (batch, n) and found.sure >= (10 if batch == 20 else 0)


def test_pursued_inputs_bad_inputs_are_clear_errors():
    from fcn_analytic.disaggregate import pursued_inputs

    gw, gb, x, delta = _layer_gradient(6, n=120, seed=0)
    with pytest.raises(GIError, match="must be >= 2"):
        pursued_inputs(gw, gb, 1)
    with pytest.raises(GIError, match="rank < batch=6"):
        pursued_inputs(delta[:3].T @ x[:3], gb, 6)
    with pytest.raises(GIError, match="zeros=0 in"):
        pursued_inputs(gw, gb, 6, zeros=0)
    signed = delta.T @ (x - 0.5)  # inputs of both signs: too few directions of the cone for six inputs
    with pytest.raises(GIError, match="of 6 inputs"):
        pursued_inputs(signed, delta.sum(0), 6)


def _rows(zeros: list[int], n: int = 40) -> torch.Tensor:
    """Nonnegative rows of length ``n``, row i zero on its first ``zeros[i]`` entries and 1 elsewhere."""
    x = torch.ones(len(zeros), n, dtype=torch.float64)
    for i, z in enumerate(zeros):
        x[i, :z] = 0
    return x


@pytest.mark.parametrize("vertex_zeros, pursuit_sure, taken, sure", [
    ([9, 9, 9, 9], 4, "vertices", 4),  # every vertex sparse (2·batch zeros, half the most of any): no pursuit
    ([9, 3, 3, 9], 3, "pursuit", 3),  # two vertices mix inputs (only batch − 1 zeros): the pursuit, surer, is taken
    ([3, 3, 3, 9], 1, "vertices", 4),  # inputs denser than 2·batch zeros: the pursuit is no surer, the vertices stay
    ([9, 9], 2, "pursuit", 2),  # too few vertices: the pursuit whatever it is sure of
    ([9, 20, 20, 20], 4, "pursuit", 4),  # a vertex under half the most zeros a vertex has mixes inputs
])
def test_search_inputs_takes_the_pursuit_where_the_vertices_mix_inputs(monkeypatch, vertex_zeros, pursuit_sure,
                                                                        taken, sure):
    import fcn_analytic.disaggregate as disaggregate

    vertices, pursued = _rows(vertex_zeros), _rows([20, 21, 22, 23])
    monkeypatch.setattr(disaggregate, "vertex_inputs", lambda *a, **k: vertices)
    monkeypatch.setattr(disaggregate, "pursued_inputs", lambda *a, **k: disaggregate.LinearInputs(
        pursued, torch.zeros(4, 3), 0, 0.0, sure=pursuit_sure))
    inputs, _, found, said = disaggregate.search_inputs(torch.zeros(3, 40), torch.zeros(3), 4)
    assert torch.equal(inputs, vertices if taken == "vertices" else pursued)
    assert (found, said) == (len(vertex_zeros), sure)
