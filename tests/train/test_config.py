"""Configs, property-based: any `key=value` overrides either load into a TrainConfig whose every field
has its declared type and a sane value, or raise one ValueError, one line, that names the key."""
from __future__ import annotations

import math
import re
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from depthpack.core.config import ModelConfig, load_yaml
from depthpack.train.config import dump_yaml
from depthpack.data.config import DataConfig
from depthpack.train import load_train_config
from depthpack.train.config import MOVED_QUERY_KEYS, QueryConfig, TrainConfig

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"

KEYS = ([f.name for f in fields(TrainConfig)] + [f"model.{f.name}" for f in fields(ModelConfig)]
        + [f"data.{f.name}" for f in fields(DataConfig)] + [f"queries.{f.name}" for f in fields(QueryConfig)]
        + list(MOVED_QUERY_KEYS)
        + ["nope", "model.nope", "data.nope", "steps.x", "x..y", "", " ", "model.depth.x", "1abc"])
YAML_VALUES = ["true", "false", "null", "~", "", "0", "1", "-1", "2", "8", "64", "1.5", "1e9", "1e-3", "1e400", "-1e-3",
               "nan", ".nan", ".inf", "-.inf", "9" * 30, "0x10", "2024", "x", "''", "[]", "[1, 2]", "[64, 64]",
               "[8, 16, 64]", "[8, x]", "[true]", "{a: 1}", "[1,", "{", "'unterminated", "cpu", "cuda", "cuda:0", "tpu",
               "auto", "tiny", "small", "vits", "huge", "indoor", "synthetic", "kitti", "runs/x", "/", "[[1]]"]
values = st.one_of(st.sampled_from(YAML_VALUES), st.integers(-(10**20), 10**20).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=6))
override = st.tuples(st.sampled_from(KEYS), values).map(lambda kv: f"{kv[0]}={kv[1]}")


def _check_types(obj) -> None:
    """Every field of a config dataclass has the type its annotation declares; numbers are finite."""
    for f in fields(obj):
        v, kind = getattr(obj, f.name), f.type
        where = f"{type(obj).__name__}.{f.name} = {v!r}"
        if v is None:
            assert kind.endswith("| None"), where
            continue
        base = kind.removesuffix(" | None")
        if base == "int":
            assert isinstance(v, int) and not isinstance(v, bool), where
        elif base == "float":
            assert isinstance(v, float) and math.isfinite(v), where
        elif base == "bool":
            assert isinstance(v, bool), where
        elif base == "str":
            assert isinstance(v, str), where
        elif base.startswith(("tuple[", "list[")):
            assert isinstance(v, tuple if base.startswith("tuple") else list), where
            elem = int if "[int" in base else float
            assert all(isinstance(x, elem) and not isinstance(x, bool) for x in v), where
            if elem is float:
                assert all(math.isfinite(x) for x in v), where
        elif is_dataclass(v):
            _check_types(v)


def _names(item: str) -> set[str]:
    return {p.strip() for p in item.split("=", 1)[0].split(".") if p.strip()}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(override, max_size=4))
@example(["steps=true"])
@example(["steps=1e9"])
@example(["steps=1.5"])
@example(["out_dir="])
@example(["model=3"])
@example(["steps=3", "steps.x=3"])
@example(["model.img_size=[64]"])
@example(["model.img_size=87178291199"])  # the glance grid was derived from it by a loop over every pixel count
@example(["model.img_size=697426329592"])
@example(["queries.max=1e30"])
@example(["q_max=1e30"])
@example(["queries=[8, 16]", "queries.edge_frac=0.3"])
def test_overrides_load_typed_or_name_the_key(items):
    try:
        cfg = load_train_config(TINY, items)
    except ValueError as e:
        msg = str(e)
        assert "\n" not in msg and msg.strip(), repr(msg)
        named = {n for item in items for n in _names(item)}
        # the message names a key that was given (or quotes the override that is not a key=value)
        assert any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", msg) for n in named) \
            or any(repr(item) in msg for item in items), (items, msg)
        return
    _check_types(cfg)
    mcfg = cfg.model_config()
    _check_types(mcfg)
    assert cfg.steps >= 0 and cfg.batch_size >= 1 and cfg.lr > 0 and cfg.out_dir.strip()
    qs = cfg.query_choices()  # a list (queries.counts) or a range, never materialized here: it may be huge
    ends = (min(qs), max(qs)) if isinstance(qs, list) else (qs[0], qs[-1])
    assert qs and 1 <= ends[0] and ends[1] <= mcfg.buckets[-1]
    assert all(s % mcfg.patch_size == 0 for s in mcfg.img_size)


@settings(max_examples=60, deadline=None)
@given(st.lists(override, max_size=3))
def test_the_written_config_loads_back_the_same(tmp_path_factory, items):
    """What a run writes to config.yaml is a config that loads to the same TrainConfig (resume reads it)."""
    try:
        cfg = load_train_config(TINY, items)
    except ValueError:
        return
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    dump_yaml(cfg, path)
    assert load_train_config(path) == cfg
    assert isinstance(load_yaml(path), dict)


@pytest.mark.parametrize("item, value", [("steps=1e9", 10**9), ("lr=1e-3", 1e-3), ("seed='12345678901234567'", None),
                                         ("model.img_size=64", (64, 64)), ("model.buckets=[64, 8]", (8, 64))])
def test_numbers_given_as_text_or_scalars_become_what_the_field_declares(item, value):
    if item.startswith("seed"):  # an integer literal is read exactly (a float would round it)
        with pytest.raises(ValueError, match=r"seed must lie in \[0, 2\*\*32\)"):
            load_train_config(TINY, [item])
        return
    cfg = load_train_config(TINY, [item])
    got = {"steps": cfg.steps, "lr": cfg.lr}.get(item.split("=")[0])
    if got is None:
        mcfg = cfg.model_config()
        got = mcfg.img_size if "img_size" in item else mcfg.buckets
    assert got == value and type(got) is type(value)


def test_resume_without_a_checkpoint_says_so(tmp_path, capsys):
    """resume=true in a folder with no checkpoint starts from step 0, and says so (never silently)."""
    from depthpack.train import train

    out = tmp_path / "fresh"
    summary = train(load_train_config(TINY, [f"out_dir={out}", "steps=1", "eval_images=1", "resume=true"]))
    assert summary["resumed_from"] == 0 and summary["step"] == 1
    assert f"resume: {out} holds no checkpoint yet; starting from step 0" in capsys.readouterr().out


def test_old_top_level_query_keys_are_one_error_that_says_what_to_write(tmp_path):
    """The query settings were top-level keys before they became one mapping (queries): an old config or
    override is refused with the new keys, and what the message says to write loads to the same settings."""
    assert set(MOVED_QUERY_KEYS.values()) <= {f.name for f in fields(QueryConfig)}
    old = tmp_path / "old.yaml"
    old.write_text("preset: tiny\nqueries: [8, 16]\nextra_points: 15\nedge_source: depth\n")
    for path, items, where in ((TINY, ["q_min=4", "q_max=32", "edge_frac=0.3", "random_budgets=true"], "overrides"),
                               (old, [], f"config {old}")):
        with pytest.raises(ValueError) as e:
            load_train_config(path, items)
        msg = str(e.value)
        assert msg.startswith(f"{where}: ") and "\n" not in msg
        assert all(k in msg for k in (*(i.split("=")[0] for i in items), *([] if items else ["queries as a list"])))
        said = re.search(r"write (.*) \(in a YAML file: (queries: \{.*\})\)$", msg)
        written = load_train_config(TINY, said[1].split(" "))
        from_yaml = tmp_path / "new.yaml"
        from_yaml.write_text(f"preset: tiny\n{said[2]}\n")
        assert load_train_config(from_yaml).queries == written.queries
        want = ({"min": 4, "max": 32, "edge_frac": 0.3, "random_budgets": True} if items else
                {"counts": [8, 16], "extra_points": 15, "edge_source": "depth"})
        assert {k: getattr(written.queries, k) for k in want} == want


def test_the_dense_first_schedule_then_the_training_path():
    from depthpack.train.config import step_path

    cfg = load_train_config(TINY, ["dense_first_steps=3", "dense_first_size=[32,32]"])
    assert [step_path(cfg, s) for s in (1, 3, 4, 9)] == [("dense", (32, 32))] * 2 + [("packed", None)] * 2
    assert step_path(load_train_config(TINY, ["train_path=dense"]), 1) == ("dense", None)
    with pytest.raises(ValueError, match="dense_first_size"):
        load_train_config(TINY, ["dense_first_size=[30,32]"])
