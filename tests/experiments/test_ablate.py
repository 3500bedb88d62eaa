"""gi ablate: strict config, settings/variants resolution, paper look-up (the end-to-end run is in tests/e2e)."""

from __future__ import annotations

import pytest

from gi.core.config import load
from gi.core.errors import ConfigError
from gi.experiments.ablate import _paper_value
from gi.experiments.config.ablate import AblateConfig, setting_config


def test_table_configs_load_and_settings_override_the_base():
    cfg = load(AblateConfig, "configs/ablate/table3.yaml")
    assert len(cfg.settings) == 8 and cfg.modes == ["truth", "hard", "joint", "recovered", "recovered+joint"]
    s = setting_config(cfg, "smoothing/cosine/trained")
    assert (s.protocol.label_aug, s.attack.objective, s.attack.regularizers, s.train.epochs) == \
        ("smoothing", "cosine", {"tv": 1e-3}, 50)
    assert setting_config(cfg, "mixup/L2/untrained").train.epochs == 0
    t4 = load(AblateConfig, "configs/ablate/table4.yaml")
    assert t4.attack_variants["a0-b2"] == {"last_layer_weight": 0.0, "feature_weight": 2.0}


def test_old_top_level_variants_key_reads_as_attack_variants():
    """``variants`` was the old spelling of ``attack_variants`` (it clashed with ``labels.variants``, the label-method
    variants): it still loads, to the same place, and both spellings with different values are refused."""
    cfg = load(AblateConfig, "configs/ablate/table3.yaml", ["variants={v: {lr: 0.5}}"])
    assert cfg.attack_variants == {"v": {"lr": 0.5}}
    with pytest.raises(ConfigError, match="variants.*attack_variants.*keep attack_variants only"):
        load(AblateConfig, "configs/ablate/table4.yaml", ["variants={v: {lr: 0.5}}"])


def test_paper_lookup_accepts_wildcards():
    cfg = AblateConfig(paper={"s/*/truth": {"psnr": 1.0}, "*/v/*": {"psnr": 2.0}, "s/v/joint": {"psnr": 3.0}})
    assert _paper_value(cfg, "s", "v", "joint") == {"psnr": 3.0}
    assert _paper_value(cfg, "s", "v", "truth") == {"psnr": 1.0}
    assert _paper_value(cfg, "x", "v", "hard") == {"psnr": 2.0}
    assert _paper_value(cfg, "x", "w", "hard") == {}


@pytest.mark.parametrize("over, match", [
    (["modes=[truth, psychic]"], "modes has unknown"),
    (["attack_variants={a: {alpha: 1}}"], "attack_variants.a has unknown attack key"),
    (["settings={a: {attack.objectiv: l2}}"], "settings.a"),
    (["only=[nope]"], "only names unknown setting"),
    (["trials=0"], "trials"),
    (["attack.bogus=1"], "unknown config key"),
])
def test_bad_ablation_configs_raise_clear_errors(over, match):
    with pytest.raises(ConfigError, match=match):
        load(AblateConfig, "configs/ablate/table4.yaml", over)


@pytest.mark.parametrize("override, match", [
    ("data.captures=3", r"^data.captures=3: renamed, write trials instead"),
    ("data.images=[0,1]", r"^gi ablate draws `trials` random client batches per setting; data.images would be ignored"),
])
def test_gi_run_batch_keys_are_refused_not_ignored(override, match):
    """One name for the client batches attacked, trials, in every command; gi ablate refuses data.images."""
    with pytest.raises(ConfigError, match=match) as info:
        load(AblateConfig, "configs/ablate/table4.yaml", [override])
    assert "\n" not in str(info.value)


def test_a_row_feature_layer_the_model_lacks_is_refused_before_any_capture(tmp_path, monkeypatch):
    """A variant's attack.feature_layer names no module of the victim's model: the setting stops at once, before
    a client batch is captured."""
    import gi.experiments.ablate as ablate

    def no_capture(*args, **kwargs):
        raise AssertionError("a capture was made before the bad attack.feature_layer was refused")

    monkeypatch.setattr(ablate, "capture_client", no_capture)
    cfg = load(AblateConfig, "configs/ablate/table4.yaml", [f"out={tmp_path / 'a'}", "only=[mixup/L2]", "trials=1",
                                                              "attack_variants={v: {feature_layer: body.9}}"])
    with pytest.raises(ConfigError, match=r"attack.feature_layer='body.9' is no module"):
        ablate.run_setting(cfg, "mixup/L2", tmp_path / "a")


def test_the_ablation_table_gets_a_page_with_its_plot(tmp_path):
    import time

    from gi.experiments.ablate_output import write_ablation

    table = [{"setting": "s", "variant": "base", "mode": m, "psnr": p, "paper_psnr": None}
             for m, p in (("truth", 20.5), ("<b>recovered</b>", 18.25))]
    write_ablation(tmp_path, "n", table, [{"psnr": 20.5}], time.perf_counter())
    page = (tmp_path / "report.html").read_text()
    assert "<td>20.5</td>" in page and "<td>&lt;b&gt;recovered&lt;/b&gt;</td>" in page
    assert page.count("data:image/png;base64,") == 1  # psnr.png
