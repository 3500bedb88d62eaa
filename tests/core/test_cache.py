"""The on-disk cache is an input: entries are written atomically, checked against their digest on load, rebuilt
with a warning when damaged (a kill mid-write included), refused with the path when replaced by other weights."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gi.core.cache import read_entry, record_path, write_entry
from gi.core.errors import CacheError
from gi.core.lru import LRU

KEY = "test-entry"


def _build() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(6, 3)


def _train(model: torch.nn.Module) -> dict:
    with torch.no_grad():
        model.weight.add_(1.0)
    return {"trained": 1}


def _trained(monkeypatch, root, calls):
    """``gi.world.build.trained_model`` of :func:`_build` / :func:`_train` with an empty in-memory cache, counting
    the trainings in ``calls``."""
    from gi.world import build

    monkeypatch.setenv("GI_CACHE_DIR", str(root))
    monkeypatch.setattr(build, "TRAINED", LRU(4))

    def train(model):
        calls.append(1)
        return _train(model)

    return build.trained_model(KEY, _build, train, disk=True)


def _entry(root):
    (path,) = (root / "trained").glob("*.safetensors")
    return path


def _expected() -> dict:
    model = _build()
    _train(model)
    return model.state_dict()


def _same(model, state) -> bool:
    return all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_entry_round_trip_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "e.safetensors"
    write_entry(path, {"a": torch.arange(5.0)}, {"note": "x"})
    tensors, record = read_entry(path)
    assert torch.equal(tensors["a"], torch.arange(5.0)) and record == {"note": "x"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.json", "e.safetensors"]
    assert read_entry(tmp_path / "missing.safetensors") is None


def test_a_second_run_loads_the_entry_instead_of_training(tmp_path, monkeypatch):
    calls = []
    first, _ = _trained(monkeypatch, tmp_path, calls)
    second, info = _trained(monkeypatch, tmp_path, calls)
    assert len(calls) == 1 and info == {"trained": 1} and _same(second, _expected()) and _same(first, _expected())


_KILLER = textwrap.dedent("""
    import os, signal, sys
    import torch
    sys.path.insert(0, {tests!r})
    from core.test_cache import KEY, _build, _train
    from gi.world import build
    import safetensors.torch as st

    where = sys.argv[1]
    real_save, real_replace, seen = st.save_file, os.replace, []

    def half_save(tensors, filename, metadata=None):  # the kernel kills the writer half-way through the file
        real_save(tensors, filename, metadata)
        size = os.path.getsize(filename)
        with open(filename, "r+b") as f:
            f.truncate(size // 2)
        os.kill(os.getpid(), signal.SIGKILL)

    def killing_replace(src, dst):  # killed between the tensor file's rename and the record's
        seen.append(dst)
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)

    if where == "during":
        st.save_file = half_save
    else:
        os.replace = killing_replace
    build.trained_model(KEY, _build, _train, disk=True)
""")


@pytest.mark.parametrize("where", ["during", "between"])
def test_an_entry_whose_writer_was_killed_is_rebuilt_with_a_warning(tmp_path, monkeypatch, caplog, where):
    tests = os.path.dirname(os.path.dirname(__file__))
    env = {**os.environ, "GI_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _KILLER.format(tests=tests), where], env=env, capture_output=True,
                          timeout=120)
    assert done.returncode == -9, done.stderr.decode()[-2000:]  # the writer really died by SIGKILL
    left = sorted(p.name for p in (tmp_path / "trained").iterdir())
    assert left and (where == "between" or all(n.endswith(".tmp") for n in left))
    calls = []
    with caplog.at_level(logging.WARNING, logger="gi.cache"):
        model, info = _trained(monkeypatch, tmp_path, calls)
    assert len(calls) == 1 and _same(model, _expected()) and info == {"trained": 1}
    assert "rebuilt" in caplog.text
    assert sorted(p.suffix for p in (tmp_path / "trained").iterdir()) == [".json", ".safetensors"]
    calls.clear()
    _trained(monkeypatch, tmp_path, calls)
    assert not calls  # the rebuilt entry is complete


def test_a_truncated_or_legacy_entry_is_rebuilt_with_a_warning(tmp_path, monkeypatch, caplog):
    calls = []
    _trained(monkeypatch, tmp_path, calls)
    path = _entry(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])  # a writer that wrote straight to the final path, then died
    with caplog.at_level(logging.WARNING, logger="gi.cache"):
        model, _ = _trained(monkeypatch, tmp_path, calls)
    assert len(calls) == 2 and _same(model, _expected()) and "is damaged" in caplog.text
    record_path(path).write_text(json.dumps({"trained": 1}))  # an older cache's record: no digest
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gi.cache"):
        _trained(monkeypatch, tmp_path, calls)
    assert len(calls) == 3 and "has no digest" in caplog.text


def test_an_entry_replaced_by_other_weights_is_refused_naming_the_path(tmp_path, monkeypatch, caplog):
    from safetensors.torch import save_file

    calls = []
    _trained(monkeypatch, tmp_path, calls)
    path = _entry(tmp_path)
    other = {k: v + 5 for k, v in _expected().items()}
    save_file(other, str(path))  # a valid checkpoint, not the one the digest names
    with pytest.raises(CacheError, match=f"{path.name} does not match the digest.*GI_CACHE_REBUILD=1"):
        _trained(monkeypatch, tmp_path, calls)
    assert len(calls) == 1
    monkeypatch.setenv("GI_CACHE_REBUILD", "1")
    with caplog.at_level(logging.WARNING, logger="gi.cache"):
        model, _ = _trained(monkeypatch, tmp_path, calls)
    assert len(calls) == 2 and _same(model, _expected()) and "does not match its digest" in caplog.text


def test_an_entry_of_another_model_is_rebuilt(tmp_path, monkeypatch, caplog):
    calls = []
    _trained(monkeypatch, tmp_path, calls)
    path = _entry(tmp_path)
    write_entry(path, {"weight": torch.zeros(2, 2)}, {"trained": 1})  # intact, digest right, wrong shapes
    with caplog.at_level(logging.WARNING):
        model, _ = _trained(monkeypatch, tmp_path, calls)
    assert len(calls) == 2 and _same(model, _expected()) and "does not fit the model" in caplog.text


def test_a_damaged_training_entry_is_retrained(tmp_path, monkeypatch, caplog):
    from gi.world.train import train_model

    monkeypatch.setenv("GI_CACHE_DIR", str(tmp_path))
    x, y = torch.rand(16, 6), torch.randint(0, 3, (16,))
    reference = _build()
    train_model(reference, x, y, epochs=1, batch_size=4, generator=torch.Generator().manual_seed(1))
    (path,) = (tmp_path / "train").glob("*.safetensors")
    path.write_bytes(path.read_bytes()[:40])
    model = _build()
    with caplog.at_level(logging.WARNING, logger="gi.cache"):
        stats = train_model(model, x, y, epochs=1, batch_size=4, generator=torch.Generator().manual_seed(1))
    assert "cached" not in stats and "is damaged" in caplog.text and _same(model, reference.state_dict())


def test_only_the_temporary_files_of_dead_writers_of_this_host_are_removed(tmp_path):
    """A writer still at work (alive, or on another host sharing $GI_CACHE_DIR) keeps its temporary file."""
    from gi.core.owners import HOST

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / "e.safetensors"
    live = tmp_path / f".e.safetensors.{os.getpid()}@{HOST}.tmp"
    gone = tmp_path / f".e.safetensors.{int(dead.stdout)}@{HOST}.tmp"
    foreign = tmp_path / f".e.json.{int(dead.stdout)}@another-host.example.tmp"
    for p in (live, gone, foreign):
        p.write_bytes(b"half")
    assert read_entry(path) is None
    assert live.exists() and foreign.exists() and not gone.exists()
