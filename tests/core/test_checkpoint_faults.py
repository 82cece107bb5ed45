"""Checkpoint faults, property-based: whatever happens to the newest checkpoint's meta.json, config.json
or the run's latest.json, finding and loading the run's checkpoint either uses that checkpoint (the
damage did not matter) or falls back to the previous intact one; never another exception."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from depthpack.core import checkpoint as ck
from depthpack.core.files import sha256_bytes

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from depthpack.train import load_train_config, train

    out = tmp_path_factory.mktemp("ckrun") / "run"
    train(load_train_config(TINY, [f"out_dir={out}", "steps=6", "ckpt_every=3", "eval_images=1"]))
    assert [d.name for d in ck.list_checkpoints(out)] == ["step_00000003", "step_00000006"]
    return out


json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                           max_leaves=6)
FILES = (ck.WEIGHTS, ck.STATE, ck.CONFIG)
# where in meta.json to strike: the whole document, "files", one file's entry, or one field of it
targets = st.one_of(st.just(()), st.just(("files",)), st.sampled_from(FILES).map(lambda n: ("files", n)),
                    st.tuples(st.sampled_from(FILES), st.sampled_from(["size", "sha256"])).map(lambda t: ("files", *t)))
meta_edits = st.tuples(st.just("meta"), targets, st.sampled_from(["drop", "replace"]), json_values)
latest_edits = st.tuples(st.just("latest"), st.just(()), st.sampled_from(["replace"]), json_values)
# a config.json of another structure, with meta.json rehashed so that it verifies as far as hashes go
config_edits = st.tuples(st.just("config"), st.just(()), st.sampled_from(["replace"]), json_values)
bytes_edits = st.tuples(st.sampled_from(["meta_bytes", "latest_bytes"]), st.just(()), st.just("replace"),
                        st.binary(max_size=16))


def _strike(doc, path: tuple, action: str, value):
    if not path:
        return value if action == "replace" else None
    node = doc
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return doc
        node = node[key]
    if isinstance(node, dict):
        if action == "drop":
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return doc


def _apply(run: Path, edit) -> None:
    kind, path, action, value = edit
    newest = ck.list_checkpoints(run)[-1]
    meta_path = newest / ck.META
    if kind == "meta":
        doc = _strike(json.loads(meta_path.read_text()), path, action, value)
        meta_path.write_text("" if doc is None else json.dumps(doc))
    elif kind == "latest":
        (run / ck.LATEST).write_text(json.dumps(value))
    elif kind == "config":
        blob = json.dumps(value).encode()
        (newest / ck.CONFIG).write_bytes(blob)
        meta = json.loads(meta_path.read_text())
        meta["files"][ck.CONFIG] = {"size": len(blob), "sha256": sha256_bytes(blob)}
        meta_path.write_text(json.dumps(meta))
    elif kind == "meta_bytes":
        meta_path.write_bytes(value)
    else:
        (run / ck.LATEST).write_bytes(value)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(meta_edits, latest_edits, config_edits, bytes_edits))
@example(("meta", ("files", ck.WEIGHTS, "sha256"), "drop", None))  # the KeyError: 'sha256'
@example(("meta", ("files", ck.CONFIG), "replace", "x"))
@example(("config", (), "replace", [1, 2]))  # a config.json of the wrong structure
@example(("config", (), "replace", {"model": {"patch_size": "x"}}))
@example(("meta_bytes", (), "replace", b"\xff\xfe"))
@example(("latest_bytes", (), "replace", b"\xff\xfe"))
def test_damaged_newest_checkpoint_is_used_or_skipped_never_a_crash(run, tmp_path_factory, edit):
    copy = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(run, copy)
    _apply(copy, edit)
    older, newest = ck.list_checkpoints(copy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d, blobs = ck.latest_checkpoint(copy)
        model = ck.load_model(copy)
    assert d in (older, newest)
    assert set(blobs) == set(FILES) and model.cfg.img_size == (64, 64)
    if d == older:  # the fallback is said, naming the damaged file
        assert any(str(newest) in str(w.message) for w in caught), [str(w.message) for w in caught]
    else:
        ck.verify_checkpoint(newest)


def test_meta_entry_without_sha256_falls_back_to_the_previous_checkpoint(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    _apply(copy, ("meta", ("files", ck.WEIGHTS, "sha256"), "drop", None))
    older, newest = ck.list_checkpoints(copy)
    with pytest.raises(ck.CheckpointError, match="lacks a size and sha256"):
        ck.verify_checkpoint(newest)
    with pytest.warns(UserWarning, match=f"{newest / ck.META}.*lacks a size and sha256.*previous checkpoint"):
        assert ck.latest_checkpoint(copy)[0] == older


def test_no_usable_checkpoint_is_one_error_naming_every_file(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for d in ck.list_checkpoints(copy):
        (d / ck.META).write_text("{}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a total failure is the error alone, no warning before it
        with pytest.raises(ck.CheckpointError) as e:
            ck.latest_checkpoint(copy)
    msg = str(e.value)
    assert "\n" not in msg and all(str(d / ck.META) in msg for d in ck.list_checkpoints(copy))


def test_config_of_wrong_structure_in_a_checkpoint_folder_is_one_error(run, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(ck.list_checkpoints(run)[-1], d)
    (d / ck.META).unlink()  # a bare folder: no hashes to check, the structure is all there is
    (d / ck.CONFIG).write_text('{"model": 3}')
    with pytest.raises(ck.CheckpointError, match=r"config.json: not a depthpack checkpoint config"):
        ck.load_model(d)
    (d / ck.CONFIG).write_text('{"model": {"preset": "tiny"}}')
    with pytest.raises(ck.CheckpointError, match=r"config.json: its model config cannot be built.*preset"):
        ck.load_model(d)


def _flip_a_weight_byte(weights: Path) -> None:
    """One byte of the last tensor's data flipped: the file still parses, one weight differs."""
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))


def test_weights_without_meta_json_are_checked_or_said_unchecked(run, tmp_path):
    """A run's step folder without meta.json is incomplete (refused, as verify_checkpoint refuses it); a bare
    folder, or a weights file that meta.json does not describe, loads with one warning that it is unchecked."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    step = ck.list_checkpoints(copy)[-1]
    _flip_a_weight_byte(step / ck.WEIGHTS)
    (step / ck.META).unlink()
    with pytest.raises(ck.CheckpointError, match=f"checkpoint {step} is incomplete: meta.json is missing"):
        ck.load_model(step)
    bare = tmp_path / "bare"
    shutil.copytree(step, bare)
    best = tmp_path / "described" / "best.safetensors"
    shutil.copytree(ck.list_checkpoints(run)[-1], best.parent)
    shutil.copy(bare / ck.WEIGHTS, best)
    for path in (bare, bare / ck.WEIGHTS, best):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ck.load_model(path)
        said = [str(w.message) for w in caught]
        assert len(said) == 1 and said[0].startswith(f"{path if path.is_file() else path / ck.WEIGHTS}: no meta.json")
        assert "cannot be checked" in said[0] and "\n" not in said[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a folder that meta.json describes loads without a word
        ck.load_model(ck.list_checkpoints(run)[-1])


def test_a_prune_cut_short_leaves_an_incomplete_folder_that_a_run_removes(run, tmp_path, monkeypatch):
    """_prune deletes meta.json first, so a kill in the middle of deleting a checkpoint leaves a folder that
    reads as incomplete (never as a corrupt checkpoint to warn about); remove_incomplete clears such folders,
    never one that a live process is writing."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    older, newest = ck.list_checkpoints(copy)
    monkeypatch.setattr(ck.shutil, "rmtree", lambda *a, **k: None)  # killed right after meta.json went
    ck._prune(copy, keep=1)
    monkeypatch.undo()
    assert older.is_dir() and not (older / ck.META).exists()
    writing = ck.step_dir(copy, 9)  # a live writer (this process) has begun a checkpoint
    writing.mkdir()
    (writing / f".{ck.WEIGHTS}.tmp{os.getpid()}").write_bytes(b"half")
    killed = ck.step_dir(copy, 12)  # a dead one left a temporary
    killed.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (killed / f".{ck.STATE}.tmp{int(dead.stdout)}").write_bytes(b"half")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ck.remove_incomplete(copy) == [older, killed]
        assert ck.latest_checkpoint(copy)[0] == newest
    assert [d.name for d in ck.list_checkpoints(copy)] == [newest.name, writing.name]


def _same_weights(model, folder: Path) -> bool:
    from safetensors.torch import load_file

    want = load_file(str(folder / ck.WEIGHTS))
    return all(bool((model.state_dict()[k] == v).all()) for k, v in want.items())


def test_a_weights_file_path_loads_that_file_never_its_folders_model_safetensors(run, tmp_path):
    """best_step3.safetensors beside step 6's model.safetensors: the file given is the file loaded (eval,
    export and bench load through load_model), and eval.json names it."""
    older, newest = ck.list_checkpoints(run)
    d = tmp_path / "ckpt"
    shutil.copytree(newest, d)
    best = d / "best_step3.safetensors"
    shutil.copy(older / ck.WEIGHTS, best)
    assert _same_weights(ck.load_model(best), older) and not _same_weights(ck.load_model(best), newest)
    assert _same_weights(ck.load_model(d), newest)  # a folder keeps its meaning: its model.safetensors
    assert ck.checkpoint_files(best) == (d, best)
    from depthpack.eval.evaluate import main as eval_main

    result = eval_main(["--checkpoint", str(best), "--queries", "4", "--max-images", "1", "--paths", "packed",
                        "--anchors", "on", "--figure-images", "0", "--no-progress", "--out", str(tmp_path / "ev")])
    assert result["weights"] == str(best)
    (d / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ck.CheckpointError, match=f"{d / 'junk.safetensors'}: not a readable safetensors file"):
        ck.load_model(d / "junk.safetensors")


def test_a_missing_file_or_config_is_named_as_the_user_gave_it(run, tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    shutil.copy(ck.list_checkpoints(run)[-1] / ck.WEIGHTS, d / "best.safetensors")
    with pytest.raises(ck.CheckpointError, match=f"checkpoint {d / 'best.safetensors'}: config.json is missing"):
        ck.load_model(d / "best.safetensors")
    with pytest.raises(ck.CheckpointError, match=f"checkpoint {d / ck.WEIGHTS} does not exist"):
        ck.load_model(d / ck.WEIGHTS)


def test_latest_json_naming_a_deleted_step_folder_says_it_is_gone(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    older, newest = ck.list_checkpoints(copy)
    shutil.rmtree(newest)
    with pytest.warns(UserWarning, match=f"checkpoint {newest} is gone: the folder does not exist; using the previous"):
        assert ck.latest_checkpoint(copy)[0] == older
    shutil.rmtree(older)
    with pytest.raises(ck.CheckpointError, match=f"checkpoint {newest} is gone") as e:
        ck.latest_checkpoint(copy)
    assert "meta.json is missing" not in str(e.value)
