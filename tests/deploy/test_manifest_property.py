"""The manifest contract, property-based: any mutation of a real manifest (keys dropped, wrong types,
wrong shapes, bad sha256 strings, path-like file names, huge or non-finite numbers) either loads and
still satisfies the contract, or is one ManifestError (a ValueError) with a one-line message; never
another exception, here or in the device check the loaders run next.

The manifest is the one the exporter writes for the tiny preset (buckets 8 and 64, ONNX), built by
hand from the contract module (an export costs a minute; tests/deploy/test_export.py holds the
real one to the same keys).
"""
from __future__ import annotations

import copy
import json
import math
import platform
import re

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st

from depthpack.deploy.contract import (BUCKET_KEYS, DTYPES, FOCAL_UNITS, FORMAT, FRAME_FORMATS, MAP_PACKAGE, PREPROCESS,
                                       REQUIRED_KEYS, TOLERANCE, ManifestError, check_device, io_specs, map_specs,
                                       onnx_name, package_name, read_manifest)

SHA = "ab" * 32


FOCAL = {"default": 40.0, "canonical": 48.0, "units": FOCAL_UNITS}  # a model with a focal input


def real_manifest(frame: dict | None = None, focal: dict | None = None, oneway: bool = False) -> dict:
    """oneway: a one-way model with a glance depth: a map, and the map-only package."""
    buckets = []
    dmap = (32, 32) if oneway else None
    for k in (8, 64):
        inputs, outputs = io_specs((64, 64), 1, k, frame, focal is not None, dmap)
        buckets.append({"bucket": k, "file": package_name(k), "sha256": SHA, "inputs": inputs, "outputs": outputs})
    inputs, outputs = map_specs((64, 64), 1, frame, focal is not None, dmap) if oneway else (None, None)
    return {
        "format": FORMAT, "preset": "tiny",
        "model_config": {"img_size": [64, 64], "patch_size": 8, "embed_dim": 64, "buckets": [8, 64],
                         "glance_stream": "oneway" if oneway else "shared"},
        **({"map": {"size": [32, 32], "file": MAP_PACKAGE, "sha256": SHA, "inputs": inputs, "outputs": outputs}}
           if oneway else {}),
        "image_size": [64, 64], "patch_size": 8, "batch_size": 1, "device": "cpu", "compute_capability": None,
        "arch": platform.machine(), "dtype": "float32", "torch_version": torch.__version__,
        "min_depth": 0.1, "max_depth": 20.0, "frame": frame, **({"focal": dict(focal)} if focal else {}),
        "preprocess": dict(PREPROCESS),
        "tolerance": dict(TOLERANCE["float32"]), "buckets": buckets,
        "onnx": [{"bucket": k, "file": onnx_name(k), "sha256": SHA} for k in (8, 64)],
        "reference": {"file": "reference.safetensors", "sha256": SHA, "image": "reference.png",
                      "points_csv": "reference_points.csv"},
        "weights": {"file": "weights.safetensors", "sha256": SHA},
    }


def satisfies_contract(m: dict) -> None:
    """What every runner relies on, written out independently of read_manifest."""
    def pos(v, most=None):
        return type(v) is int and v > 0 and (most is None or v <= most)
    assert m["format"] == FORMAT and all(k in m for k in REQUIRED_KEYS)
    H, W = m["image_size"]
    p = m["patch_size"]
    assert pos(H, 1 << 14) and pos(W, 1 << 14) and pos(p) and H % p == 0 and W % p == 0
    assert pos(m["batch_size"], 1 << 12) and m["device"] in ("cpu", "cuda") and m["dtype"] in DTYPES
    assert isinstance(m["arch"], str) and isinstance(m["torch_version"], str)
    assert (m["compute_capability"] is None) == (m["device"] == "cpu")
    assert 0 < m["min_depth"] < m["max_depth"] < math.inf
    assert all(type(m["tolerance"][k]) in (int, float) and 0 <= m["tolerance"][k] < math.inf for k in ("atol", "rtol"))
    frame = m["frame"]
    assert frame is None or (frame["color"] in FRAME_FORMATS.values() and all(pos(s) for s in frame["size"]))
    focal = m.get("focal")
    assert focal is None or (all(type(focal[k]) in (int, float) and 0 < focal[k] < math.inf for k in ("default", "canonical"))
                             and focal["units"] == FOCAL_UNITS)
    ks = [b["bucket"] for b in m["buckets"]]
    assert ks and ks == sorted(set(ks)) and all(pos(k, (H // p) * (W // p)) for k in ks)
    weights = m["weights"]
    assert weights is None or set(weights) >= {"file", "sha256"}
    files = ([b["file"] for b in m["buckets"]] + [m["reference"]["file"]] + [o["file"] for o in m.get("onnx", [])]
             + ([weights["file"]] if weights else []))
    assert all(isinstance(f, str) and f and f not in (".", "..") and "/" not in f and "\\" not in f for f in files)
    shas = ([b["sha256"] for b in m["buckets"]] + [m["reference"]["sha256"]] + [o["sha256"] for o in m.get("onnx", [])]
            + ([weights["sha256"]] if weights else []))
    assert all(re.fullmatch(r"[0-9a-f]{64}", s) for s in shas)
    dmap = m.get("map")
    assert dmap is None or (len(dmap["size"]) == 2 and all(pos(s) for s in dmap["size"]))
    size = tuple(dmap["size"]) if dmap else None
    for b in m["buckets"]:
        assert set(BUCKET_KEYS) <= set(b)
        assert (b["inputs"], b["outputs"]) == tuple(io_specs((H, W), m["batch_size"], b["bucket"], frame, focal is not None,
                                                             size))
    if dmap and "file" in dmap:  # the map-only package: format 5, a one-way model, its specs, a plain name, a sha256
        assert m["format"] == FORMAT and m["model_config"]["glance_stream"] == "oneway"
        assert (dmap["inputs"], dmap["outputs"]) == map_specs((H, W), m["batch_size"], frame, focal is not None, size)
        assert isinstance(dmap["file"], str) and "/" not in dmap["file"] and dmap["file"] not in ("", ".", "..")
        assert re.fullmatch(r"[0-9a-f]{64}", dmap["sha256"])


def _paths(doc, prefix=()):
    """Every key path in a JSON document (lists by index)."""
    yield prefix
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        yield from _paths(v, prefix + (k,))


ALL_PATHS = [p for p in _paths(real_manifest(focal=FOCAL, oneway=True)) if p]  # a path absent from a document is skipped
nasty = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 3, 2**31, 2**63, 10**30, -10**30, 1.5, float("nan"), float("inf"),
                     "", ".", "..", "../../etc/passwd", "/etc/passwd", "a/b.pt2", "..\\x.pt2", "x\x00.pt2",
                     "depthpack_k8.pt2", "AB" * 32, "ab" * 31, "ab" * 33, "zz" * 32, "cuda", "float16", "bgr",
                     "8.7", "2.14.1", [], [64], [64, 64], [64, 64, 64], [0, 64], [10**9, 10**9], [-8, 64], {}, {"a": 1},
                     [{"name": "images", "shape": [1, 3, 64, 64], "dtype": "float32"}]]),
    st.integers(), st.floats(), st.text(max_size=8),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                 lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=5))
edits = st.lists(st.tuples(st.sampled_from(ALL_PATHS), st.sampled_from(["drop", "set"]), nasty), min_size=1, max_size=3)


def _apply(doc: dict, path: tuple, action: str, value) -> None:
    node = doc
    for key in path[:-1]:
        if isinstance(node, dict) and key in node or isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return  # an earlier edit removed the way there
    last = path[-1]
    if isinstance(node, dict):
        if action == "drop":
            node.pop(last, None)
        else:
            node[last] = value
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        if action == "drop":
            del node[last]
        else:
            node[last] = value


def _check(tmp_path_factory, doc) -> None:
    path = tmp_path_factory.mktemp("m") / "manifest.json"
    path.write_text(json.dumps(doc))
    try:
        m = read_manifest(path)
    except ManifestError as e:
        assert isinstance(e, ValueError) and "\n" not in str(e) and str(path) in str(e), str(e)
        return
    satisfies_contract(m)
    try:  # what load_runners does next: refuse this process in one ManifestError, or pass
        check_device(m, torch.device(m["device"]))
    except ManifestError as e:
        assert "\n" not in str(e)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([None, {"size": [48, 80], "color": "bgr"}]), edits, st.sampled_from([None, FOCAL]), st.booleans())
@example(None, [(("buckets", 0, "sha256"), "drop", None)], None, False)  # a KeyError once, in Predictor.from_packages
@example(None, [(("torch_version",), "set", 5)], None, False)
@example(None, [(("buckets", 0, "inputs"), "set", 5)], None, False)
@example(None, [(("reference", "file"), "set", "../../etc/passwd")], None, False)
@example(None, [(("weights", "file"), "set", "../../etc/passwd")], None, False)
@example(None, [(("weights",), "drop", None)], None, False)
@example(None, [(("tolerance", "atol"), "set", float("nan"))], None, False)
@example(None, [(("image_size",), "set", [10**9, 10**9])], None, False)
@example(None, [(("patch_size",), "set", 0)], None, False)
@example(None, [(("focal", "default"), "set", float("nan"))], FOCAL, False)
@example(None, [(("focal",), "drop", None)], FOCAL, False)  # packages with a focal input, no manifest entry
@example(None, [(("buckets", 0, "inputs", 2), "drop", None)], FOCAL, False)
@example(None, [(("map", "file"), "drop", None)], None, True)  # a map-only package without its file
@example(None, [(("model_config",), "set", 5)], None, True)  # no glance_stream to read
@example(None, [(("map", "inputs", 0), "drop", None)], FOCAL, True)
def test_mutated_manifest_loads_within_the_contract_or_is_one_manifest_error(tmp_path_factory, frame, edits, focal,
                                                                             oneway):
    doc = copy.deepcopy(real_manifest(frame, focal, oneway))
    for edit in edits:
        _apply(doc, *edit)
    _check(tmp_path_factory, doc)


@pytest.mark.parametrize("oneway", [False, True])
@pytest.mark.parametrize("focal", [None, FOCAL])
@pytest.mark.parametrize("frame", [None, {"size": [48, 80], "color": "bgr"}])
def test_the_unmutated_manifest_loads(tmp_path, frame, focal, oneway):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(real_manifest(frame, focal, oneway)))
    m = read_manifest(path)
    satisfies_contract(m)
    assert [t["name"] for t in m["buckets"][0]["inputs"]][2:] == (["focal"] if focal else [])


@pytest.mark.parametrize("edit,words", [
    (lambda m: m.pop("focal"), "tensor shapes"),  # inputs take focal, the manifest has no entry
    (lambda m: m["focal"].update(default=0), "focal must be null or"),
    (lambda m: m["focal"].update(units="model pixels"), "focal must be null or"),
    (lambda m: [b["inputs"].pop() for b in m["buckets"]], "tensor shapes"),  # an entry, inputs without focal
])
def test_focal_entry_and_inputs_must_agree(tmp_path, edit, words):
    doc = real_manifest(focal=FOCAL)
    edit(doc)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=re.escape(words)):
        read_manifest(path)


@pytest.mark.parametrize("text", ["", "[" * 100000, "\xff", "null", "[]", '"x"', json.dumps({"format": FORMAT})])
def test_manifest_that_is_not_a_manifest_is_one_error(tmp_path, text):
    path = tmp_path / "manifest.json"
    path.write_bytes(text.encode("latin-1") if text == "\xff" else text.encode())
    with pytest.raises(ManifestError, match=re.escape(str(path))):
        read_manifest(path)


def test_predictor_aoti_with_a_bucket_without_sha256_is_one_manifest_error(tmp_path):
    from depthpack.runtime.predictor import Predictor

    doc = real_manifest()
    del doc["buckets"][0]["sha256"]
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=r"buckets\[0\]: missing keys \['sha256'\]"):
        Predictor.from_packages(path, device="cpu")
