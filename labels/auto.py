"""``auto``: the label stage picks its method from the capture.

The picker is a table of rules (:data:`PICK_RULES`), tried in order; the first whose condition holds names the method,
its options and the reason. It reads only what the server sees (the capture's protocol and batch size) and
whether the attacker holds auxiliary samples:

* a one-epoch plain-SGD FedAvg round of a conv net with a hidden Linear layer → ``fc-inputs`` (each sample's label
  from that layer's disaggregated update, :func:`labels.fc_inputs.reads_round`; on a failure the next rule);
* a FedAvg-style update → ``rlu`` (Chen & Vikalo 2024), which reads the bias update and needs aux samples
  (without them: ``ilrg-update``, iLRG on the averaged step gradient);
* a single-sample FedSGD gradient → ``soft-lambda`` with ``kind=auto`` (Wang, Liang & He 2024: one-hot, label
  smoothing or mixup, the most restrictive kind that explains the gradient), which also gives the
  last-layer feature λ·g_r of eq. 8;
* a FedSGD batch with aux data → ``posterior`` (posterior-probability counts, Theorem 2, eq. 3);
* a FedSGD batch without aux data → ``ilrg-robust``.

The result is the chosen method's :class:`LabelResult` (its ``method`` is the chosen name) with
``info["picked_by"] = "auto"`` and ``info["why"]``, the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gi.capture import Capture
from gi.label_result import LabelResult
from labels.base import METHODS, register
from labels.fc_inputs import reads_round

NAME = "auto"


@dataclass(frozen=True)
class Rule:
    """``when(capture, aux)`` → this rule picks ``method`` with ``options``; ``why`` is logged and recorded."""

    when: Callable[[Capture, Any], bool]
    method: str
    why: str
    options: dict[str, Any] = field(default_factory=dict)


PICK_RULES: list[Rule] = [
    Rule(lambda c, aux: reads_round(c), "fc-inputs",
         "a one-epoch plain-SGD FedAvg round of a conv net with a hidden Linear layer: each sample's label from that "
         "layer's disaggregated update (docs/results/client-round.md: counts exact on 19 of 20 rounds, RLU 7)"),
    Rule(lambda c, aux: c.is_update and aux is not None, "rlu",
         "a FedAvg-style update with aux data: RLU's least squares on the bias update"),
    Rule(lambda c, aux: c.is_update, "ilrg-update",
         "a FedAvg-style update without aux data (RLU needs aux samples; set aux.per_class): iLRG on the averaged "
         "step gradient"),
    Rule(lambda c, aux: c.num_samples == 1, "soft-lambda",
         "a single-sample FedSGD gradient: the soft-label search (one-hot, smoothing or mixup), which also gives "
         "the last-layer feature", {"kind": "auto"}),
    Rule(lambda c, aux: aux is not None, "posterior",
         "a FedSGD batch with aux data: posterior-probability counts"),
    Rule(lambda c, aux: True, "ilrg-robust",
         "a FedSGD batch without aux data: iLRG with conditioned class embeddings"),
]


def candidates(capture: Capture, aux: Any = None) -> list[Rule]:
    """The rules of :data:`PICK_RULES` whose condition holds for ``capture`` (and ``aux``), in order."""
    return [rule for rule in PICK_RULES if rule.when(capture, aux)]


def pick(capture: Capture, aux: Any = None) -> Rule:
    """The first rule of :data:`PICK_RULES` whose condition holds for ``capture`` (and ``aux``)."""
    return candidates(capture, aux)[0]


@register(NAME, "the default: picks soft-lambda (one sample), posterior (batch + aux), ilrg-robust (batch) or rlu "
                "(an update) from the capture")
def recover_auto(capture: Capture, aux: Any = None) -> LabelResult:
    """Recover labels with the method :func:`pick` chooses; the choice and its reason go to ``info``. A method
    that cannot decide (``ok=False``, e.g. ``posterior`` with an aux set that misses a class) hands over to the
    next rule that holds; the reasons of the ones passed over go to ``info["passed_over"]``."""
    passed: list[str] = []
    result = None
    for rule in candidates(capture, aux):
        result = METHODS[rule.method](capture, aux=aux, **rule.options)
        result.info.update({"picked_by": NAME, "why": rule.why + "".join(f"; {p}" for p in passed),
                            "options": dict(rule.options), "passed_over": list(passed)})
        if result.ok:
            break
        passed.append(f"{rule.method} failed ({result.info.get('reason', 'no reason given')})")
    assert result is not None  # the last rule always holds
    return result
