"""The README's Python code blocks run verbatim (iterations shortened so the suite stays fast)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no Python block"
    for block in blocks:
        code = re.sub(r"iterations=\d+", "iterations=3", block)
        code = re.sub(r'from_preset\("(\w+)"\)', r'from_preset("\1", iterations=3)', code)
        code = code.replace("ReconConfig(", "ReconConfig(progress=False, ")
        namespace: dict = {}
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 (our own README)
        if "rec" in namespace:
            assert namespace["rec"].images.shape == namespace["images"].shape
        if "inversion" in namespace:  # the analytic image the snippet shows is what gi run answers with
            from gi.analysis.metrics import psnr

            assert float(psnr(namespace["inversion"].image, namespace["images"])) > 40
