"""The label-first attack as a library: labels → features → reconstruction (docs/architecture.md "Data flow").

One module per stage, each registering itself (:func:`gi.attack.stages.base.register_stage`; every public module
of this package is imported here, so a new stage is one new file): :mod:`~gi.attack.stages.labels` (the
``labels`` section and the label modes), :mod:`~gi.attack.stages.features` (f* and the analytic inversion),
:mod:`~gi.attack.stages.reconstruct` (the packed fit, the pipeline's pivot). :mod:`~gi.attack.stages.pipeline`
chains them (:func:`attack_stages`, :func:`prepare_attack`, :func:`reconstruct_prepared`);
:mod:`~gi.attack.stages.result` holds what they return (:class:`AttackResult`). The stage functions read captures
(and aux data), never truth; the oracle label mode alone reads truth, by request. The names below are the
package's public face (``from gi.attack.stages import LabelConfig``).
"""

from gi.attack.stages.analytic import (
    INIT_MAX_RESIDUAL,
    analytic_reconstruction,
    answers,
    inversion_residual,
    unusable_above,
)
from gi.attack.stages.base import (
    FEATURES,
    LABELS,
    RECONSTRUCT,
    STAGES,
    PreparedAttack,
    Stage,
    register_stage,
)
from gi.attack.stages.features import feature_evidence, feature_stage
from gi.attack.stages.labels import (
    LABEL_MODES,
    LABELS_DOC,
    RENAMED_LABEL_KEYS,
    LabelConfig,
    LabelMode,
    LabelTable,
    attack_labels,
    check_table,
    derived_attack,
    label_stage,
    oracle_labels,
    variant_call,
)
from gi.attack.stages.pipeline import attack_stages, can_pack, check_models, prepare_attack, reconstruct_prepared
from gi.attack.stages.reconstruct import fit_alternative, lower_mismatch, reconstruct_stage, record_mismatch
from gi.attack.stages.result import AttackResult, final_counts, mismatch_of, used_labels
from gi.attack.stages.silent import SILENT_WHY, silent_labels, silent_reconstruction, silent_warning
from gi.core.registry import import_members

__all__ = [
    "FEATURES", "INIT_MAX_RESIDUAL", "LABELS", "LABELS_DOC", "LABEL_MODES", "RECONSTRUCT", "RENAMED_LABEL_KEYS",
    "SILENT_WHY", "STAGES", "AttackResult", "LabelConfig", "LabelMode", "LabelTable", "PreparedAttack", "Stage",
    "analytic_reconstruction", "answers", "attack_labels", "attack_stages", "can_pack", "check_models",
    "check_table", "derived_attack", "feature_evidence", "feature_stage", "final_counts", "fit_alternative",
    "inversion_residual", "label_stage", "lower_mismatch", "mismatch_of", "oracle_labels", "prepare_attack",
    "reconstruct_prepared", "reconstruct_stage", "record_mismatch", "register_stage", "silent_labels",
    "silent_reconstruction", "silent_warning", "unusable_above", "used_labels", "variant_call",
]

import_members(__name__, __path__)  # every stage module registers itself
