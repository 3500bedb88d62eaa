"""Scoring and reporting: PSNR / SSIM / LPIPS and label metrics (``metrics``), the offline LPIPS weights
(``lpips_offline``) and the output writing of a run (docs/architecture.md "Layout")."""
