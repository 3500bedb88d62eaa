"""The victim's world: federated learning (``fl``), data, models, losses, training, the victim schema
(``setup``), its builders and the ``gi labels`` scenarios (docs/architecture.md "Layout").

Everything the simulated client and server do lives here; the attack side reads only what they share
(:class:`gi.capture.Capture`), and scoring reads :class:`gi.capture.Truth`.
"""

from gi.core.registry import lazy_submodules

__getattr__ = lazy_submodules(__name__, ("assets", "data", "fl", "losses", "models", "scenarios", "setup", "train"))
