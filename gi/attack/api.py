"""The attack in one call, for Python users: the same stages as ``gi attack`` (docs/architecture.md "Data flow").

``gi.attack.run(capture)`` recovers the labels (``labels.method: auto`` picks the method from the capture), the
last-layer features (and, where the net allows, the whole input analytically), then reconstructs the images with
the attack recipe of ``preset`` (``auto``: the preset registered for the capture's zoo model, else ``default``).
It never reads ground truth: score the result with :func:`gi.analysis.metrics.score` against your own
:class:`gi.Truth`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gi.attack.recon.config import ReconConfig
from gi.attack.recon.presets import AUTO, apply_preset
from gi.attack.stages import AttackResult, LabelConfig, attack_stages, derived_attack

if TYPE_CHECKING:
    from gi.capture import Capture


def run(capture: Capture | Sequence[Capture], aux: Any = None, preset: str = AUTO,
        labels: LabelConfig | str = "auto", callbacks: Sequence[Any] = (), **attack: Any) -> AttackResult:
    """labels → features → images for one capture or several captures of one global model (one batched problem).

    ``aux``: the attacker's labelled samples ``(images, labels)`` for the label methods that use them (none by
    default). ``labels``: a label method name (``auto``, or any of ``labels.METHODS``: the labels are recovered and
    held fixed) or a full :class:`~gi.attack.stages.LabelConfig` (label mode, hard method, options). ``preset``: a
    name of :data:`gi.attack.recon.presets.PRESETS` or ``auto``; ``attack`` keys (``iterations=``, ``restarts=``,
    … any :class:`~gi.attack.recon.ReconConfig` field) override it. Returns an :class:`AttackResult`: the label
    results, the feature targets, one :class:`~gi.attack.recon.Reconstruction` per capture (its
    ``history["gradient_mismatch"]``: how well it explains the capture, judged by
    :func:`gi.analysis.verdict.mismatch_verdict`; docs/usage.md, "Verdict"), the stage records and the warnings.
    """
    from gi.capture import Capture

    captures = [capture] if isinstance(capture, Capture) else list(capture)
    lcfg = labels if isinstance(labels, LabelConfig) else LabelConfig(method=labels)
    spec = captures[0].model_spec if captures else {}
    model = spec.get("name") if spec.get("provider", "zoo") == "zoo" else None
    cfg = derived_attack(lcfg, ReconConfig(**apply_preset({**attack, "preset": preset}, model=model)))
    return attack_stages(lcfg, cfg, captures, None, aux, callbacks)
