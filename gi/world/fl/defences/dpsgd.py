"""Per-example DP-SGD (Abadi et al. 2016, Algorithm 1) with Opacus' privacy accountant.

Every local step clips each sample's gradient (over all parameters) to L2 norm C (``max_grad_norm``), sums them,
adds N(0, z²C²) (z: the noise multiplier, the strength) and divides by the batch size B, as Opacus' DPOptimizer
does (``C / (‖g_i‖ + 1e-6)`` clip factors). The per-sample gradients come from ``torch.func.vmap`` over the same
functional forward the client trains with (:func:`gi.world.fl.defences.client.defended_gradient`), so every model of
``gi.world.models`` in ``eval`` mode is covered. One sample changes the step's mean gradient by at most ``2C/B``
(``C/B`` against its removal).

The privacy report is Opacus' accountant (``accountant: rdp`` or ``prv``) for a client that takes ``steps`` local
steps at sample rate ``q = B / N_k``: ε at the run's ``delta`` (default 1e-5). As is usual with Opacus, the
client's shuffled batches stand in for the Poisson sampling the analysis assumes.
"""

from __future__ import annotations

import math
from typing import Any

from gi.world.fl.defences.base import Context, Spec, register_defence

ACCOUNTANTS = ("rdp", "prv")


def check_params(params: Any, where: str = "dp-sgd") -> None:
    """dp-sgd's options checked when the protocol is built: ``0 < delta < 1`` (the δ of (ε, δ)-DP is a
    probability; Abadi et al. 2016 take it below 1/N), ``max_grad_norm > 0`` (the clipping bound C), a known
    ``accountant``. A :class:`ConfigError` names the key and the allowed range."""
    from gi.core.errors import ConfigError

    delta, clip, accountant = params.get("delta"), params.get("max_grad_norm"), params.get("accountant")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < float(delta) < 1:
        raise ConfigError(f"{where}.params.delta={delta!r}: dp-sgd's δ must lie in (0, 1), e.g. 1e-5 (below "
                          "1/N for N samples)")
    if isinstance(clip, bool) or not isinstance(clip, int | float) or not float(clip) > 0:
        raise ConfigError(f"{where}.params.max_grad_norm={clip!r}: expected > 0 (the per-sample clipping bound C)")
    if accountant not in ACCOUNTANTS:
        raise ConfigError(f"{where}.params.accountant={accountant!r}; valid: {list(ACCOUNTANTS)}")


def epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """ε of ``steps`` DP-SGD steps at ``sample_rate`` and ``noise_multiplier`` for ``delta``, from Opacus'
    ``accountant`` (``rdp`` or ``prv``); ``inf`` without noise. ``delta`` must lie in (0, 1) and ``sample_rate``
    in (0, 1] (:class:`ConfigError` otherwise). ε is never below 0: the accountants' conversions return ε < 0
    when δ is large (then δ ≥ 1 − e^ε), and (ε, δ)-DP with ε < 0 implies (0, δ)-DP, the bound reported."""
    from gi.core.errors import ConfigError

    check_params({"delta": delta, "max_grad_norm": 1.0, "accountant": accountant})
    if isinstance(sample_rate, bool) or not 0 < float(sample_rate) <= 1:
        raise ConfigError(f"dp-sgd sample rate q={sample_rate!r}: expected in (0, 1] (batch size / client samples)")
    if noise_multiplier < 0:
        raise ConfigError(f"dp-sgd noise multiplier z={noise_multiplier!r}: expected >= 0")
    if noise_multiplier <= 0 or steps <= 0:
        return math.inf if steps > 0 else 0.0
    try:
        from opacus.accountants import create_accountant
    except ImportError:
        from gi.core.errors import ConfigError

        raise ConfigError("dp-sgd reports ε with Opacus' accountant, which is not installed: pip install "
                          "'opacus>=1.6,<1.7' (or the project's extra: pip install -e '.[dp]'; make install does)") \
            from None

    acc = create_accountant(accountant)
    acc.history = [(float(noise_multiplier), float(min(sample_rate, 1.0)), int(steps))]
    try:
        eps = float(acc.get_epsilon(delta=float(delta)))
    except (ArithmeticError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"dp-sgd: Opacus' {accountant} accountant cannot compute ε for z={noise_multiplier}, "
                          f"q={sample_rate}, steps={steps}, delta={delta} ({type(exc).__name__}: {exc}); try "
                          "accountant: rdp or a smaller delta") from None
    if math.isnan(eps):
        raise ConfigError(f"dp-sgd: Opacus' {accountant} accountant gave ε = NaN for z={noise_multiplier}, "
                          f"q={sample_rate}, steps={steps}, delta={delta}")
    return max(eps, 0.0)


def _account(spec: Spec, steps: int, sample_rate: float) -> dict[str, Any]:
    p = spec.params
    return {"epsilon": epsilon(spec.strength, sample_rate, steps, p["delta"], p["accountant"]), "delta": p["delta"],
            "accountant": p["accountant"], "steps": int(steps), "sample_rate": float(sample_rate)}


@register_defence("dp-sgd", "per-example", "per-example clipping to max_grad_norm and N(0, z²C²) on every local "
                  "step (Opacus accountant: ε at delta)", "z, the noise multiplier", account=_account,
                  check=check_params, max_grad_norm=1.0, delta=1e-5, accountant="rdp")
def dp_sgd(per_sample: dict[str, Any], spec: Spec, ctx: Context) -> dict[str, Any]:
    import torch

    c = float(spec.params["max_grad_norm"])
    if c <= 0:
        from gi.core.errors import ConfigError

        raise ConfigError(f"dp-sgd params.max_grad_norm={c!r}: expected > 0")
    first = next(iter(per_sample.values()))
    b = int(first.shape[0])
    norms = torch.sqrt(sum(g.reshape(b, -1).double().pow(2).sum(1) for g in per_sample.values()))
    factor = (c / (norms + 1e-6)).clamp(max=1.0)
    out = {}
    for k, g in per_sample.items():
        summed = torch.einsum("b,b...->...", factor.to(g.dtype), g)
        if spec.strength > 0:
            summed = summed + torch.randn(summed.shape, generator=ctx.generator, dtype=g.dtype) * (spec.strength * c)
        out[k] = summed / b
    return out
