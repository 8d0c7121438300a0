# SPDX-License-Identifier: Apache-2.0
"""Configs: keyword arguments, validated with the C++ messages; region tables and overrides."""
import pytest

import memdecay as md


def test_defaults_are_the_papers():
    c = md.Config()
    assert c.alpha == 1.0 and c.tau == 0.01 and c.page_size == 16
    assert c.normalization == md.Normalization.none
    assert c.budget.unit == "unlimited"
    t = c.effective_regions()
    assert t.names == ["system", "plan", "user", "tool_in", "tool_out", "retrieval", "scratchpad"]
    assert t["system"].pinned and not t["plan"].pinned


def test_normalization_by_name_or_enum():
    assert md.Config(normalization="uniform").normalization == md.Normalization.uniform
    assert md.Config(normalization=md.Normalization.zscore).normalization == md.Normalization.zscore
    with pytest.raises(md.ConfigError, match="normalization = 'bogus'"):
        md.Config(normalization="bogus")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(alpha=-1.0), "alpha"),
        (dict(ewma_beta=1.0), "ewma_beta"),
        (dict(page_size=12), "page_size"),
        (dict(tau=float("nan")), "tau"),
        (dict(budget=md.Budget.tokens(100, 200)), "budget.low"),
        (dict(budget=md.Budget.ratio(1.5)), "budget.high"),
        (dict(region_overrides=[md.RegionOverride("nonexistent", pinned=True)]), "nonexistent"),
        (dict(protection=md.Protection(recent_fraction=2.0)), "recent_fraction"),
    ],
)
def test_invalid_fields_are_config_errors_naming_the_field(kwargs, field):
    with pytest.raises(md.ConfigError, match=field):
        md.Config(**kwargs)


def test_config_error_is_a_value_error_and_usage_error_a_runtime_error():
    assert issubclass(md.ConfigError, ValueError)
    assert issubclass(md.InputError, ValueError)
    assert issubclass(md.UsageError, RuntimeError)


def test_overrides_apply_on_top_of_the_table():
    c = md.Config(region_overrides=[md.RegionOverride("plan", pinned=True, half_life=50.0)])
    plan = c.effective_regions()["plan"]
    assert plan.pinned
    assert plan.half_life == pytest.approx(50.0)


def test_custom_region_tables():
    table = md.RegionTable([md.Region("prompt", pinned=True), md.Region("chat", base_priority=0.5, half_life=10.0)])
    assert len(table) == 2 and table.id_of("chat") == 1
    seq = md.Sequence(md.Config(regions=table))
    seq.append("prompt", 16)
    seq.append("chat", 20)
    assert seq.labels().tolist() == [0] * 16 + [1] * 20
    with pytest.raises(md.ConfigError):
        md.RegionTable([md.Region("a"), md.Region("a")])
    with pytest.raises(md.ConfigError, match="decay_rate or half_life"):
        md.Region("x", decay_rate=0.1, half_life=3.0)


def test_calibration_files_apply(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{}")
    with pytest.raises(md.ConfigError):
        md.apply_calibration(md.Config(), str(path))
