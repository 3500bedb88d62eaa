"""What the README and ``gi --help`` show runs as written (docs/usage.md, "Commands").

- The Python code blocks of the README and of docs/usage.md run verbatim (iterations shortened so the suite stays
  fast); the README's run in a fresh folder, with none of the repository's uninstalled folders (``examples``,
  ``scripts``, ``tests``) importable: they must run from wherever a user pastes them.
- Every shell command of the README's code blocks and every example of ``gi --help`` / ``gi <command> --help``
  follows one rule: a ``make`` line names a target of the Makefile; a ``gi`` line in :data:`FAST` (or one that
  ends in ``--check``) runs verbatim, in document order, in a fresh folder holding the repository's ``configs``
  (a clone's layout, so ``gi attack runs/demo-latest`` finds what ``gi run configs/demo.yaml`` wrote); any other
  ``gi`` line (a long job) runs verbatim with ``--check`` appended: its config and overrides load through the
  command's own loader.
- Every relative link of the README and of docs/ names a file of the repository and, with ``#``, a heading of it;
  no link leaves the repository.
"""

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/usage.md"]
UNINSTALLED = ("examples", "scripts", "tests", "research")  # folders of the repository that pip does not install

# the gi lines that run verbatim: seconds each (the demo is one image the analytic inversion answers)
FAST = {
    "gi --help",
    "gi run configs/demo.yaml",
    "gi attack runs/demo-latest",
    "gi attack runs/demo-latest truth=runs/demo-latest",
    "gi run configs/demo.yaml labels.mode=truth",
    "gi run configs/demo.yaml labels.mode=truth attack.iterations=5000",
    "gi methods",
}


def _psnr(rec, truth):
    from gi.analysis.metrics import psnr

    return float(psnr(rec, truth))


def _shortened(block: str) -> str:
    code = re.sub(r"iterations=\d+", "iterations=3", block)
    code = re.sub(r'from_preset\("(\w+)"\)', r'from_preset("\1", iterations=3)', code)
    return code.replace("ReconConfig(", "ReconConfig(progress=False, ")


def run_python_blocks(doc: str) -> None:
    """Run ``doc``'s Python blocks (:func:`_shortened`) one after the other and check what they answer."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)
    assert blocks, f"{doc} has no Python block"
    for block in blocks:
        namespace: dict = {"__name__": "__main__"}
        exec(compile(_shortened(block), doc, "exec"), namespace)  # noqa: S102 (our own documentation)
        if "rec" in namespace:
            assert namespace["rec"].images.shape == namespace["images"].shape
        if "inversion" in namespace:  # the analytic image the snippet shows is what gi run answers with
            assert _psnr(namespace["inversion"].image, namespace["images"]) > 40
        if "result" in namespace and hasattr(namespace["result"], "stages"):  # gi.attack.run: the three stages
            assert [s["name"] for s in namespace["result"].stages] == ["labels", "features", "reconstruct"]
            if namespace["rec"].history.get("answered_by") == "analytic inversion":
                assert _psnr(namespace["rec"].images, namespace["images"]) > 40


def test_usage_python_blocks_run():
    run_python_blocks("docs/usage.md")


def test_readme_python_blocks_run_from_any_folder(tmp_path):
    """In a subprocess whose working folder is empty and where the repository's uninstalled folders cannot be
    imported (``import examples`` fails as in a pip install)."""
    script = f"import runpy, sys; sys.argv = ['', 'README.md']; runpy.run_path({str(Path(__file__))!r}, " \
             "run_name='__main__')"
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "GI_THREADS": "1", "MPLBACKEND": "Agg"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "README.md: blocks ran"


# ----------------------------------------------------------------------------- shell commands
def readme_commands() -> list[str]:
    """The command lines of the README's unlabelled code blocks (comments stripped)."""
    text = (ROOT / "README.md").read_text()
    blocks = [m[2] for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if not m[1]]
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def help_commands(capsys) -> list[str]:
    """The example lines of ``gi --help`` and of every ``gi <command> --help``: a line indented by two spaces that
    starts with ``gi ``, up to the first gap of two spaces (the description column)."""
    from gi.cli import COMMANDS

    texts = [_gi(["--help"], capsys)[1]] + [_gi([name, "--help"], capsys)[1] for name in COMMANDS]
    return [re.split(r"\s{2,}", line.strip())[0] for text in texts for line in text.splitlines()
            if re.match(r"  gi \S", line)]


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def _gi(argv: list[str], capsys) -> tuple[int, str]:
    from gi.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # --help
        code = exc.code or 0
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_every_command_of_the_readme_and_of_gi_help_runs_as_written(tmp_path, monkeypatch, capsys):
    readme, helps = readme_commands(), help_commands(capsys)
    assert "gi run configs/demo.yaml" in readme and "gi attack runs/demo-latest" in helps
    commands = list(dict.fromkeys(readme + helps))  # document order, each once
    bad = [c for c in commands if "<" in c or "[" in c or "CAPTURE" in c or "CONFIG" in c]
    assert not bad, f"placeholders in commands shown as runnable: {bad}"
    (tmp_path / "configs").symlink_to(ROOT / "configs")  # a clone's layout: configs/ in the working folder
    monkeypatch.chdir(tmp_path)
    targets = make_targets()
    for command in commands:
        words = command.split()
        if words[0] == "make":
            assert set(words[1:]) <= targets, f"{command}: no such Makefile target"
            continue
        assert words[0] == "gi", f"{command}: a README command is a gi or make line"
        verbatim = command in FAST or words[-1] == "--check"
        code, out = _gi(words[1:] if verbatim else [*words[1:], "--check"], capsys)
        assert code == 0, f"{command}{'' if verbatim else ' --check'}: exit {code}\n{out[-2000:]}"
        if words[:2] == ["gi", "run"] and verbatim and words[-1] != "--check":
            wrote = re.search(r"^wrote (\S+)", out, re.M)[1]
            assert f"attack its capture: gi attack {wrote} truth={wrote}" in out
            assert os.path.realpath("runs/demo-latest") == os.path.realpath(wrote)


# ----------------------------------------------------------------------------- links
def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[`*]", "", text)
    return "".join(ch for ch in text if ch.isalnum() or ch in " -_").replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", path.read_text(), flags=re.S), re.M):
        base = name = _anchor(heading)
        n = 0
        while name in found:  # a repeated heading gets -1, -2, ...
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def test_links_stay_in_the_repository_and_resolve():
    bad = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            path, _, fragment = link.partition("#")
            target = (doc.parent / path) if path else doc
            if re.match(r"[a-z]+:", link) or ".." in Path(os.path.relpath(target.resolve(), ROOT)).parts:
                bad.append(f"{doc.relative_to(ROOT)}: {link} leaves the repository")
            elif not target.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {link}: no such file")
            elif fragment and target.suffix == ".md" and fragment not in _anchors(target):
                bad.append(f"{doc.relative_to(ROOT)}: {link}: no such heading")
    assert "../shared" not in (ROOT / "README.md").read_text()
    assert not bad, "\n".join(bad)


def test_no_readme_table_cell_is_over_120_characters():
    cells = [cell.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("|")
             for cell in line.strip().strip("|").split("|")]
    assert cells and max(len(c) for c in cells) <= 120, max(cells, key=len)


if __name__ == "__main__":  # test_readme_python_blocks_run_from_any_folder runs this file with DOC
    for name in UNINSTALLED:
        sys.modules[name] = None  # type: ignore[assignment]  # `import examples` raises, as after pip install
    with contextlib.redirect_stdout(sys.stderr):
        run_python_blocks(sys.argv[1])
    print(f"{sys.argv[1]}: blocks ran")
