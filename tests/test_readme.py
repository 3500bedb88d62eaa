"""What the README and ``gi --help`` show runs as written (docs/usage.md, "Commands").

- The Python code blocks of the README and of docs/usage.md run verbatim (iterations shortened so the suite stays
  fast); the README's run in a fresh folder, with none of the repository's uninstalled folders (``examples``,
  ``scripts``, ``tests``) importable: they must run from wherever a user pastes them.
- Every shell command of the README's code blocks and every example of ``gi --help`` / ``gi <command> --help``
  runs verbatim: a ``make`` line names a target of the Makefile; a ``gi`` line runs, in document order, in a fresh
  folder holding the repository's ``configs`` (a clone's layout, so ``gi attack runs/demo-latest`` finds what
  ``gi run configs/demo.yaml`` wrote), exits 0 and prints its answer (the verdict, the folder or file it wrote, the
  config it checked). They are the seconds-long demos (``configs/**/demo.yaml``); the long reproductions are in
  docs/usage.md ("Full reproductions"), whose ``gi`` lines of "Commands" not run above run with ``--check``
  appended: their config and overrides load through the command's own loader.
- Every relative link of the README and of docs/ names a file of the repository and, with ``#``, a heading of it;
  no link leaves the repository.
"""

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

from gi.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
UNINSTALLED = ("examples", "scripts", "tests", "research")  # folders of the repository that pip does not install


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
def shell_commands(doc: str, section: str | None = None) -> list[str]:
    """The command lines of ``doc``'s unlabelled code blocks (comments stripped), or of those in ``section`` (a
    ``##`` heading: up to the next one)."""
    text = (ROOT / doc).read_text()
    if section is not None:
        text = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = [m[2] for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if not m[1]]
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def help_commands(capsys) -> list[str]:
    """The example lines of ``gi --help`` and of every ``gi <command> --help``: a line indented by two spaces that
    starts with ``gi ``, up to the first gap of two spaces (the description column)."""
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


def _answered(command: str, out: str) -> None:
    """What a command prints when it has done its work: the verdict of an attack, the folder or file it wrote (which
    exists), the config it checked, the help's examples, the label methods."""
    words = command.split()
    if words[-1] == "--check":
        assert "the config loads" in out, f"{command}: {out[-2000:]}"
    elif words[1] == "--help":
        assert "examples (" in out and all(f"  gi {name} " in out for name in ("run", "labels", "bench"))
    elif words[1] == "methods":
        assert "idlg" in out and "soft-lambda" in out
    else:
        wrote = re.search(r"^wrote (\S+)", out, re.M)
        assert wrote and Path(wrote[1]).exists(), f"{command}: names no output it wrote\n{out[-2000:]}"
        if words[1] in ("run", "attack"):
            assert re.search(r"^verdict: ", out, re.M), f"{command}: no verdict\n{out[-2000:]}"
        if words[1] == "run":
            assert f"attack its capture: gi attack {wrote[1]} truth={wrote[1]}" in out
            assert os.path.realpath("runs/demo-latest") == os.path.realpath(wrote[1])


def test_every_command_of_the_readme_and_of_gi_help_runs_as_written(tmp_path, monkeypatch, capsys):
    readme, helps = shell_commands("README.md"), help_commands(capsys)
    assert "gi run configs/demo.yaml" in readme and "gi attack runs/demo-latest" in helps
    commands = list(dict.fromkeys(readme + helps))  # document order, each once
    bad = [c for c in commands if "<" in c or "[" in c or "CAPTURE" in c or "CONFIG" in c]
    assert not bad, f"placeholders in commands shown as runnable: {bad}"
    shown = {c.split()[1] for c in commands if c.startswith("gi ")}
    assert shown >= {"--help", *COMMANDS}, f"no example of gi {sorted({*COMMANDS} - shown)}"
    (tmp_path / "configs").symlink_to(ROOT / "configs")  # a clone's layout: configs/ in the working folder
    monkeypatch.chdir(tmp_path)
    targets = make_targets()
    for command in commands:
        words = command.split()
        if words[0] == "make":
            assert set(words[1:]) <= targets, f"{command}: no such Makefile target"
            continue
        assert words[0] == "gi", f"{command}: a README command is a gi or make line"
        code, out = _gi(words[1:], capsys)
        assert code == 0, f"{command}: exit {code}\n{out[-2000:]}"
        _answered(command, out)
    # docs/usage.md's "Commands" (the full reproductions too): what the lines above did not run loads by --check
    for command in dict.fromkeys(shell_commands("docs/usage.md", "Commands")):
        words = command.split()
        if words[0] == "make":
            assert set(words[1:]) <= targets, f"{command}: no such Makefile target"
        elif command not in commands:
            checked = words if words[-1] == "--check" else [*words, "--check"]
            code, out = _gi(checked[1:], capsys)
            assert code == 0, f"{' '.join(checked)}: exit {code}\n{out[-2000:]}"
            _answered(" ".join(checked), out)


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
