"""The Python code blocks of the README and of docs/usage.md run verbatim (iterations shortened so the suite stays
fast)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/usage.md"]


def _psnr(rec, truth):
    from gi.analysis.metrics import psnr

    return float(psnr(rec, truth))


@pytest.mark.parametrize("doc", DOCS)
def test_python_blocks_run(doc):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)
    assert blocks, f"{doc} has no Python block"
    for block in blocks:
        code = re.sub(r"iterations=\d+", "iterations=3", block)
        code = re.sub(r'from_preset\("(\w+)"\)', r'from_preset("\1", iterations=3)', code)
        code = code.replace("ReconConfig(", "ReconConfig(progress=False, ")
        namespace: dict = {}
        exec(compile(code, doc, "exec"), namespace)  # noqa: S102 (our own documentation)
        if "rec" in namespace:
            assert namespace["rec"].images.shape == namespace["images"].shape
        if "inversion" in namespace:  # the analytic image the snippet shows is what gi run answers with
            assert _psnr(namespace["inversion"].image, namespace["images"]) > 40
        if "result" in namespace and hasattr(namespace["result"], "stages"):  # gi.attack.run: the three stages
            assert [s["name"] for s in namespace["result"].stages] == ["labels", "features", "reconstruct"]
            if namespace["rec"].history.get("answered_by") == "analytic inversion":
                assert _psnr(namespace["rec"].images, namespace["images"]) > 40
