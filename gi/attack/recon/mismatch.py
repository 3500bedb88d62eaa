"""How well a reconstruction explains what the client shared, without ground truth: the relative mismatch

    ‖s(x̂, ŷ) − s*‖ / ‖s*‖,  over every shared tensor at once (the root of Σ_l ‖·‖² over Σ_l ‖s*_l‖²),

of the FedSGD gradient (or the FedAvg update) ``s`` the client would have shared for the final images x̂ and slot
labels ŷ against the captured ``s*`` (docs/usage.md, "Verdict"). ``s`` comes from the simulator the attack
objective uses (:mod:`gi.attack.recon.simulate`, with the captured output error where the reconstruction used it,
``attack.output_error``), unweighted: every shared tensor counts, also those the objective weights 0.

0 means the images and labels reproduce the capture exactly; 1 is what sharing nothing (s = 0) would score. The
attack's own signal, so it is available where truth is not (``gi attack`` without ``truth=``).

A small mismatch says the final images explain the capture together, not that each of them is pinned by it: an
image whose own share of the gradient is small (a sample the net already fits) can be anything without moving the
mismatch. :func:`slot_swap_distances` measures, per slot, how far the share moves when that slot's image is
replaced by its own mean colour (the trivial guess the verdict with truth compares with).

Where the attack matched features (eq. 8's f*, or the inputs of ``attack.feature_layer`` found from that layer's
gradient), :func:`feature_mismatch` is the same ratio for them: ‖f(x̂) − f*‖ / ‖f*‖, how far the final images
are from reproducing the features the gradient gave.
"""

from __future__ import annotations

import math

import torch

from gi.attack.recon.batchnorm_decoupled import batch_norm_layers
from gi.attack.recon.problem import captured_output_error
from gi.attack.recon.simulate import gradient_simulator, update_simulator
from gi.capture import Capture
from gi.world.losses import output_error_loss
from gi.world.models import features_and_logits

Tensor = torch.Tensor


def simulated_share(capture: Capture, images: Tensor, labels: Tensor, output_error: str = "simulated",
                    model: torch.nn.Module | None = None) -> dict[str, Tensor]:
    """What the client would have shared for ``images`` (B, C, H, W) with slot labels ``labels`` (B, C): every
    tensor of ``capture.shared``, on the CPU, float32. ``output_error``: ``captured`` simulates with the capture's
    ∂L/∂z (:func:`gi.attack.recon.problem.captured_output_error`), as the reconstruction did; anything else with
    the protocol's loss of ``labels``. ``model``: the capture's model when the caller already rebuilt it
    (:meth:`gi.Capture.model`; its parameters are set not to require gradients)."""
    model = capture.model() if model is None else model
    model = model.cpu()
    for p in model.parameters():
        p.requires_grad_(False)
    train = capture.protocol.model_mode == "train"
    model.train(train)
    names = list(capture.shared)
    x, y = images.detach().float().cpu(), labels.detach().float().cpu()
    if capture.is_update:
        if train:  # torch.func's local steps cannot update BatchNorm running stats in place
            torch.func.replace_all_batch_norm_modules_(model)
        simulate = update_simulator(model, capture.protocol, names, num_samples=x.shape[0],
                                    history={k: v.cpu() for k, v in capture.history.items()}, trained=names)
    else:
        error = captured_output_error(capture) if output_error == "captured" else None
        if error is not None:
            y = error.float().cpu()
        simulate = gradient_simulator(model, capture.protocol, names, autograd=True,
                                      loss=output_error_loss if error is not None else None)
    shared, _ = simulate(x, y)
    return {k: v.detach() for k, v in shared.items()}


def feature_mismatch(capture: Capture, images: Tensor, target: Tensor, layer: str | None = None,
                     model: torch.nn.Module | None = None) -> float:
    """‖f(x̂) − f*‖ / ‖f*‖ over all slots together (float64): ``f`` the input of module ``layer`` (None: the last
    layer, eq. 8's f_{N−1}) for the final ``images`` (B, C, H, W) in slot order, forwarded together in the protocol's
    mode (BatchNorm in train mode sees the batch, as the client's forward did); ``target`` f* (B, D), slot order.
    ``model``: the capture's model when the caller already rebuilt it."""
    return feature_mismatches(capture, images, target, layer, model)[0]


def feature_mismatches(capture: Capture, images: Tensor, target: Tensor, layer: str | None = None,
                       model: torch.nn.Module | None = None) -> tuple[float, list[float]]:
    """:func:`feature_mismatch` over all slots together, and per slot ‖f_i(x̂) − f*_i‖ / ‖f*_i‖ (one forward
    pass): how far each image is from reproducing its own slot's target (0 where both are zero, inf where only the
    target is)."""
    model = (capture.model() if model is None else model).cpu()
    model.train(capture.protocol.model_mode == "train")
    with torch.no_grad():
        f = features_and_logits(model, images.detach().float().cpu(), layer)[0].double()
    t = target.detach().double().cpu().reshape(f.shape)
    f, t = f.reshape(f.shape[0], -1), t.reshape(t.shape[0], -1)
    return _ratio((f - t).norm(), t.norm()), [_ratio(d, n) for d, n in zip((f - t).norm(dim=1), t.norm(dim=1))]


def feature_swap_mismatches(capture: Capture, images: Tensor, target: Tensor, layer: str | None = None,
                            model: torch.nn.Module | None = None) -> list[float]:
    """Per slot i, ‖f_i(c) − f*_i‖ / ‖f*_i‖ with slot i's image replaced by its own mean colour c_i (the trivial
    guess the verdict with truth compares with): what :func:`feature_mismatches`' per-slot value would be for that
    guess, beside which the image's own value says how much of its target the image explains beyond its mean
    colour. Without BatchNorm in train mode a sample's features do not depend on the others, so every slot's mean
    colour is forwarded in one batch; in train mode each slot is swapped alone (B forward passes)."""
    model = (capture.model() if model is None else model).cpu()
    train = capture.protocol.model_mode == "train"
    model.train(train)
    x = images.detach().float().cpu()
    colours = x.mean((2, 3), keepdim=True).expand_as(x).contiguous()
    t = target.detach().double().cpu().reshape(x.shape[0], -1)
    coupled = train and bool(batch_norm_layers(model))
    with torch.no_grad():
        if not coupled:
            f = features_and_logits(model, colours, layer)[0].double().reshape(x.shape[0], -1)
        else:
            rows = []
            for i in range(x.shape[0]):
                swapped = x.clone()
                swapped[i] = colours[i]
                rows.append(features_and_logits(model, swapped, layer)[0].double().reshape(x.shape[0], -1)[i])
            f = torch.stack(rows)
    return [_ratio(d, n) for d, n in zip((f - t).norm(dim=1), t.norm(dim=1))]


def _ratio(diff: Tensor, norm: Tensor) -> float:
    """``diff / norm`` as a float: 0 where both are 0, inf where only ``norm`` is."""
    diff, norm = float(diff), float(norm)
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


# elements per block of the sums below: a large layer's gradient (FCN-4 at 64×64: 50 M weights) is never copied
# whole (to float64, or as s − s*), which cost ~1 s of page faults per capture, more than its analytic inversion
CHUNK = 1 << 18


def _squared_sums(s: Tensor, t: Tensor) -> tuple[float, float]:
    """(Σ (s − t)², Σ t²), accumulated in float64 block by block of :data:`CHUNK` elements (s − t itself in the
    tensors' dtype)."""
    if s.shape != t.shape:
        raise ValueError(f"simulated shape {tuple(s.shape)} does not match the target's {tuple(t.shape)}")
    s, t = s.detach().cpu().reshape(-1), t.detach().cpu().reshape(-1)
    diff = norm = 0.0
    for i in range(0, t.numel(), CHUNK):
        tc = t[i:i + CHUNK]
        diff += float(torch.linalg.vector_norm(s[i:i + CHUNK] - tc, dtype=torch.float64)) ** 2
        norm += float(torch.linalg.vector_norm(tc, dtype=torch.float64)) ** 2
    return diff, norm


def relative_mismatch(simulated: dict[str, Tensor], target: dict[str, Tensor]) -> float:
    """‖s − s*‖ / ‖s*‖ over every tensor of ``target`` together (float64); inf when the target is all zero and
    ``s`` is not, 0 when both are."""
    sums = [_squared_sums(simulated[k], target[k]) for k in target]
    diff, norm = sum(d for d, _ in sums), sum(n for _, n in sums)
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return math.sqrt(diff / norm)


def shared_mismatch(capture: Capture, images: Tensor, labels: Tensor, output_error: str = "simulated",
                    model: torch.nn.Module | None = None) -> float:
    """The relative mismatch of this module's docstring for one capture's reconstruction (:func:`simulated_share`
    against ``capture.shared``)."""
    return relative_mismatch(simulated_share(capture, images, labels, output_error, model), capture.shared)


def slot_swap_distances(capture: Capture, images: Tensor, labels: Tensor, output_error: str = "simulated",
                        model: torch.nn.Module | None = None) -> list[float]:
    """Per slot i, ‖s(x̂) − s(x̂ with image i replaced by its own mean colour)‖ / ‖s*‖ (float64; the other slots and
    every label kept; :func:`simulated_share`): how far the capture tells slot i's image from the trivial guess
    the verdict with truth compares it with. Where it is small the capture would read the same for the mean
    colour in that slot, so nothing in it says the image is any better (docs/usage.md, "Verdict"). NaN for every
    slot where ``s*`` is all zero. B + 1 simulations of the capture."""
    model = capture.model() if model is None else model
    x = images.detach().float().cpu()
    base = simulated_share(capture, x, labels, output_error, model)
    scale = sum(_squared_sums(capture.shared[k], capture.shared[k])[1] for k in capture.shared)
    colours = x.mean((2, 3), keepdim=True).expand_as(x)
    out = []
    for i in range(x.shape[0]):
        swapped = x.clone()
        swapped[i] = colours[i]
        share = simulated_share(capture, swapped, labels, output_error, model)
        diff = sum(_squared_sums(share[k], base[k])[0] for k in capture.shared)
        out.append(math.sqrt(diff / scale) if scale > 0 else math.nan)
    return out


__all__ = ["feature_mismatch", "feature_swap_mismatches", "relative_mismatch", "shared_mismatch", "simulated_share",
           "slot_swap_distances"]
