"""Scoring and reporting: PSNR / SSIM / LPIPS and label metrics (``metrics``), the offline LPIPS weights
(``lpips_offline``) and the output writing of a run (docs/architecture.md "Layout")."""

from gi.core.registry import lazy_submodules

__getattr__ = lazy_submodules(__name__, ("lpips_offline", "metrics", "outputs", "report", "verdict"))
