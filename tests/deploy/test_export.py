"""Export to AOTInductor (CPU) + ONNX, the manifest contract, safe loading, refusals.

One export of the tiny preset (buckets 8 and 64, ONNX too) is shared by the module: about a minute
on 2 CPU cores, most of it AOTInductor's C++ compile.
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import with_buckets

from depthpack.core.files import sha256_file
from depthpack.core.preprocess import load_image, scale_points
from depthpack.deploy.contract import FORMAT, REQUIRED_KEYS, TOLERANCE, ManifestError, read_manifest
from depthpack.deploy.build import ExportOptions, export, load_for_export
from depthpack.deploy.package import ExportError, PackedForward, example_inputs, export_program, static_graph_problems
from depthpack.deploy.selfcheck import self_check
from depthpack.runtime.aoti import load_runners, main as aoti_main, run_packages

ROOT = Path(__file__).resolve().parents[2]
BUCKETS = (8, 64)
SPEC_KEYS = {"format", "preset", "model_config", "image_size", "patch_size", "batch_size", "device",
             "compute_capability", "arch", "dtype", "torch_version", "min_depth", "max_depth", "preprocess",
             "tolerance", "buckets", "onnx", "reference", "frame", "build", "weights", "map"}  # written out, independently of the contract


def _cli():
    spec = importlib.util.spec_from_file_location("export_cli", ROOT / "export" / "export.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_export")
    model, preset = load_for_export(preset="tiny", seed=0)
    summary = export(model, ExportOptions(out=str(out), buckets=BUCKETS, onnx=True), preset, log=lambda m: None)
    manifest = json.loads((out / "manifest.json").read_text())
    return SimpleNamespace(out=out, model=model, summary=summary, manifest=manifest)


def fresh_inputs(k: int, seed: int, batch: int = 1):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(batch, 3, 64, 64, generator=g)
    points = torch.rand(batch, k, 2, generator=g) * 63.99
    points[:, -1] = points[:, 0]  # a duplicate query
    return images, points


def test_manifest_keys_values_and_hashes(exported):
    m, out = exported.manifest, exported.out
    assert set(m) == SPEC_KEYS == set(REQUIRED_KEYS) | {"onnx", "build", "map"}
    # the default layout has the glance's map, on the one-way stream: and the map-only package
    assert m["model_config"]["glance_stream"] == "oneway"
    assert m["map"] == {"size": list(exported.model.cfg.glance_map_size), "file": "depthpack_map.pt2",
                        "sha256": sha256_file(out / "depthpack_map.pt2"),
                        "inputs": [{"name": "images", "shape": [1, 3, 64, 64], "dtype": "float32"}],
                        "outputs": [{"name": "map", "shape": [1, 32, 32], "dtype": "float32"}]}
    assert m["format"] == FORMAT == "depthpack-manifest/5" and m["preset"] == "tiny"
    assert m["image_size"] == [64, 64] and m["patch_size"] == 8 and m["batch_size"] == 1
    assert m["device"] == "cpu" and m["compute_capability"] is None and m["arch"] == platform.machine()
    assert m["dtype"] == "float32" and m["torch_version"] == torch.__version__
    assert (m["min_depth"], m["max_depth"]) == (0.1, 20.0)
    assert m["tolerance"] == TOLERANCE["float32"]
    assert m["model_config"]["buckets"] == list(BUCKETS) and m["model_config"]["embed_dim"] == 64
    assert m["preprocess"]["scale"] == 1 / 255 and m["preprocess"]["normalize_inside"] is True
    assert m["frame"] is None  # float images at the model's size
    assert [b["bucket"] for b in m["buckets"]] == list(BUCKETS)
    for b in m["buckets"]:
        k = b["bucket"]
        assert b["file"] == f"depthpack_k{k}.pt2" and sha256_file(out / b["file"]) == b["sha256"]
        assert b["inputs"] == [{"name": "images", "shape": [1, 3, 64, 64], "dtype": "float32"},
                               {"name": "points", "shape": [1, k, 2], "dtype": "float32"}]
        assert b["outputs"] == [{"name": "depth", "shape": [1, k], "dtype": "float32"},
                                {"name": "map", "shape": [1, 32, 32], "dtype": "float32"}]  # glance 4x4, patch 8
    assert [o["bucket"] for o in m["onnx"]] == list(BUCKETS)
    for o in m["onnx"]:
        assert sha256_file(out / o["file"]) == o["sha256"]
    ref = m["reference"]
    assert sha256_file(out / ref["file"]) == ref["sha256"]
    assert (out / ref["image"]).is_file() and (out / ref["points_csv"]).is_file()
    assert m["weights"]["file"] == "weights.safetensors" and sha256_file(out / "weights.safetensors") == m["weights"]["sha256"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "reference.png", "reference_points.csv", "reference.safetensors", "weights.safetensors",
         "depthpack_map.pt2"] + [f"depthpack_k{k}.{ext}" for k in BUCKETS for ext in ("pt2", "onnx")])  # no staging
    assert not list(out.parent.glob(f".{out.name}.*"))  # the staging folder is gone
    assert read_manifest(out / "manifest.json") == m


def test_every_file_of_the_export_has_the_umask_mode(exported):
    """An export copied with its modes must stay readable by a robot's service user: no file is private
    (safetensors' save_file makes 0600), each has the mode the umask gives a new file."""
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in exported.out.iterdir()}
    assert modes == {name: oct(0o666 & ~umask) for name in modes}


def test_packages_equal_eager_on_fresh_inputs(exported):
    manifest, runners = load_runners(exported.out / "manifest.json", "cpu")
    assert sorted(runners) == list(BUCKETS)
    for k, fn in runners.items():
        images, points = fresh_inputs(k, seed=100 + k)
        got, got_map = fn(images, points)
        with torch.no_grad():
            want, want_map = exported.model.packed_map_core(images, points, k)
        assert got.shape == (1, k) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got_map, want_map, atol=1e-4, rtol=1e-4)
        assert got.min() >= 0.1 - 1e-6 and got.max() <= 20.0 + 1e-5
    with pytest.raises(ValueError, match="points must be float32"):
        runners[8](images, torch.zeros(1, 9, 2))  # wrong shape: refused on the host


def test_reference_file_chunked(exported):
    out, m = exported.out, exported.manifest
    ref = load_file(str(out / "reference.safetensors"))
    images, points, depth = ref["images"], ref["points"], ref["depth"]
    assert points.shape == (1, max(BUCKETS) + 3, 2) and depth.shape == (1, max(BUCKETS) + 3)
    # the tensor is exactly preprocess(reference.png) and the CSV points, scaled
    image, (h0, w0) = load_image(out / "reference.png", (64, 64))
    assert (h0, w0) != (64, 64)
    torch.testing.assert_close(images[0], image, atol=0, rtol=0)
    csv = np.loadtxt(out / "reference_points.csv", delimiter=",", skiprows=1, dtype=np.float64)
    torch.testing.assert_close(points[0], scale_points(csv, (h0, w0), (64, 64)), atol=0, rtol=0)
    # packages, chunked and padded like the C++ runner, equal the stored eager depth
    _, runners = load_runners(out / "manifest.json", "cpu")
    got = run_packages(runners, images, points)
    torch.testing.assert_close(got, depth, **m["tolerance"])
    # and the stored depth equals the public (checked, unpadded) forward: padding changes nothing
    with torch.no_grad():
        torch.testing.assert_close(exported.model(images, points), depth, atol=1e-5, rtol=1e-5)


def test_the_one_way_map_is_one_map_whatever_the_points(exported):
    """One map per image on the one-way stream: the eager model's glance alone (glance_map_core), its
    packed buffers of two point sets on two buckets, the packages given those points, the map-only
    package and the Predictor's map-only call over the packages all give it (the packages bit-equal among
    themselves, within float32 rounding of eager: Inductor fuses otherwise)."""
    from depthpack.runtime.aoti import load_packages
    from depthpack.runtime.predictor import Predictor

    images, few = fresh_inputs(8, seed=7)
    _, many = fresh_inputs(64, seed=8)
    with torch.no_grad():
        want = exported.model.glance_map_core(images)
        eager = [exported.model.packed_map_core(images, p, k)[1] for p, k in ((few, 8), (many, 64))]
    assert all(torch.equal(e, want) for e in eager)
    _, runners, map_fn = load_packages(exported.out / "manifest.json", "cpu")
    packaged = [runners[8](images, few)[1], runners[64](images, many)[1], map_fn(images)]
    depth, dmap = Predictor.from_packages(exported.out / "manifest.json", device="cpu").predict(
        images, torch.zeros(1, 0, 2), return_map=True)
    assert depth.shape == (1, 0) and all(torch.equal(p, packaged[0]) for p in packaged[1:] + [dmap])
    torch.testing.assert_close(packaged[0], want, atol=1e-5, rtol=1e-5)


def test_an_empty_batch_through_the_packages(exported):
    """B = 0 float images: an empty [0, Q] depth and [0, rows, cols] map, not an IndexError."""
    from depthpack.runtime.predictor import Predictor

    pred = Predictor.from_packages(exported.out / "manifest.json", device="cpu")
    depth, dmap = pred.predict(torch.zeros(0, 3, 64, 64), torch.zeros(0, 5, 2), return_map=True)
    assert depth.shape == (0, 5) and dmap.shape == (0, 32, 32)
    assert pred.predict(torch.zeros(0, 3, 64, 64), torch.zeros(0, 0, 2)).shape == (0, 0)


def _as_format_4(m: dict) -> None:
    """The manifest an export before the one-way stream wrote: format 4, no glance_stream, no map-only package."""
    m["format"] = "depthpack-manifest/4"
    m["model_config"].pop("glance_stream")
    m["map"] = {"size": m["map"]["size"]}


def test_a_format_4_manifest_is_read_as_shared_stream_packages(exported, tmp_path):
    """A format 4 manifest loads as before: its packages, no map-only package, so a map-only call runs one
    point, the image's centre (packages of a one-way model give the same map either way)."""
    from depthpack.deploy.contract import glance_stream, map_package
    from depthpack.runtime.aoti import load_packages
    from depthpack.runtime.predictor import Predictor

    d = tmp_path / "old"
    shutil.copytree(exported.out, d)
    m = json.loads((d / "manifest.json").read_text())
    _as_format_4(m)
    (d / "manifest.json").write_text(json.dumps(m))
    read = read_manifest(d / "manifest.json")
    assert map_package(read) is None and glance_stream(read) == "shared"
    manifest, runners, map_fn = load_packages(d / "manifest.json", "cpu")
    assert sorted(runners) == list(BUCKETS) and map_fn is None
    images, _ = fresh_inputs(8, seed=9)
    _, dmap = Predictor.from_packages(d / "manifest.json", device="cpu").predict(images, torch.zeros(1, 0, 2),
                                                                                 return_map=True)
    centre = torch.tensor([[[32.0, 32.0]]]).expand(1, 8, 2)
    assert torch.equal(dmap, runners[8](images, centre)[1])


def test_onnx_equals_eager(exported):
    import onnxruntime as ort

    for k in BUCKETS:
        sess = ort.InferenceSession(str(exported.out / f"depthpack_k{k}.onnx"), providers=["CPUExecutionProvider"])
        images, points = fresh_inputs(k, seed=200 + k)
        got = sess.run(["depth"], {"images": images.numpy(), "points": points.numpy()})[0]
        with torch.no_grad():
            want = exported.model.packed_core(images, points, k)
        torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=1e-4)


def test_tampered_or_missing_package_refused(exported, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(exported.out, bad)
    blob = bytearray((bad / "depthpack_k8.pt2").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (bad / "depthpack_k8.pt2").write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="sha256 mismatch"):
        load_runners(bad / "manifest.json", "cpu")
    assert aoti_main(["--check", str(bad / "manifest.json")]) == 1
    assert "sha256 mismatch" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    (bad / "depthpack_k8.pt2").unlink()
    with pytest.raises(ValueError, match="missing"):
        load_runners(bad / "manifest.json", "cpu")


def test_a_truncated_package_whose_hash_fits_is_named(exported, tmp_path):
    """A .pt2 cut short (its manifest rehashed to match) is a ValueError naming the file, not the loader's
    bare "Failed to initialize zip archive"."""
    bad = tmp_path / "cut"
    shutil.copytree(exported.out, bad)
    pt2 = bad / "depthpack_k8.pt2"
    pt2.write_bytes(pt2.read_bytes()[:4096])
    m = json.loads((bad / "manifest.json").read_text())
    m["buckets"][0]["sha256"] = sha256_file(pt2)
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=f"package {pt2} cannot be loaded"):
        load_runners(bad / "manifest.json", "cpu")


def test_an_export_folder_given_as_the_manifest_names_its_manifest(exported, tmp_path, capsys):
    from depthpack import Predictor

    with pytest.raises(ValueError, match=f"is a folder; its manifest is {exported.out / 'manifest.json'}"):
        Predictor.from_packages(exported.out, device="cpu")
    assert aoti_main(["--check", str(exported.out)]) == 1
    assert "is a folder; its manifest is" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    with pytest.raises(ValueError, match=f"{tmp_path} is a folder; it holds no manifest.json"):
        read_manifest(tmp_path)


def test_manifest_device_and_arch_mismatch_refused(exported, tmp_path):
    for key, value, message in (("device", "cuda", "built for cuda"), ("arch", "sparc64", "built for sparc64"),
                                ("torch_version", "1.13.0", "built with torch 1.13.0")):
        d = tmp_path / key
        shutil.copytree(exported.out, d)
        m = dict(exported.manifest, **{key: value})
        if key == "device":  # a well-formed CUDA manifest names its compute capability
            m["compute_capability"] = "9.0"
        (d / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(ValueError, match=message):
            load_runners(d / "manifest.json", "cpu")


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("batch_size"), "missing keys"),
    (lambda m: m.update(format="depthpack-manifest/1"), "re-export"),
    (lambda m: m["buckets"][0].pop("sha256"), "missing keys \\['sha256'\\]"),
    (lambda m: m["buckets"][0].update(sha256="xyz"), "64 lowercase hex"),
    (lambda m: m["buckets"][0].update(file="../../etc/passwd"), "plain file name"),
    (lambda m: m["buckets"].reverse(), "ascending"),
    (lambda m: m["buckets"][1].update(bucket=8), "ascending"),  # bucket 8 twice
    # a bucket-8 entry that names the bucket-16 package, with that package's hash and shapes
    (lambda m: m["buckets"][0].update({k: m["buckets"][1][k] for k in ("file", "sha256", "inputs", "outputs")}),
     "not those of bucket 8"),
    (lambda m: m.update(image_size=[64]), "image_size"),
    (lambda m: m.update(tolerance={"atol": "x"}), "tolerance"),
    # the map-only package: format 5 only, a one-way model only, whole, the buckets' inputs without the points
    (lambda m: m.update(format="depthpack-manifest/4"), "map-only package .* needs format depthpack-manifest/5"),
    (lambda m: m["model_config"].update(glance_stream="shared"), "needs the one-way glance stream"),
    (lambda m: m["map"].pop("sha256"), "missing keys \\['sha256'\\] of the map-only package"),
    (lambda m: m["map"].update(file="../map.pt2"), "map: file must be a plain file name"),
    (lambda m: m["map"]["inputs"].append(m["buckets"][0]["inputs"][1]), "not \\[\\[1, 3, 64, 64\\]\\]"),
    (lambda m: m["map"]["outputs"][0].update(shape=[1, 16, 16]), "map-only package's tensors"),
])
def test_malformed_manifest_is_one_clear_error(exported, tmp_path, edit, message):
    m = json.loads(json.dumps(exported.manifest))
    edit(m)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=message):
        read_manifest(path)
    with pytest.raises(ValueError, match=message):  # the loader says the same, before loading anything
        load_runners(path, "cpu")


def test_self_check_catches_a_mismatch(exported):
    """The exporter's check really compares: a model changed after export must fail it."""
    wrong = load_for_export(preset="tiny", seed=1)[0]
    with pytest.raises(ExportError, match="differ from eager"):
        self_check(wrong, exported.out / "manifest.json", BUCKETS, 1, torch.device("cpu"), torch.Generator().manual_seed(5))


def test_self_check_crash_is_one_clear_error(exported, monkeypatch):
    """A self-check child killed by a signal (a loader crash) is one ExportError with the child's last words."""
    import depthpack.deploy.selfcheck as ex
    real = ex.subprocess.run

    def run(cmd, *args, **kwargs):
        if "depthpack.runtime.aoti" in cmd:
            return subprocess.CompletedProcess(cmd, -11, "", "Fatal Python error: Segmentation fault\n  File _load_aoti")
        return real(cmd, *args, **kwargs)
    monkeypatch.setattr(ex.subprocess, "run", run)
    with pytest.raises(ExportError, match="SIGSEGV.*NOT verified.*Segmentation fault"):
        self_check(exported.model, exported.out / "manifest.json", BUCKETS, 1, torch.device("cpu"),
                   torch.Generator().manual_seed(0))


def test_export_graph_is_static():
    model = load_for_export(preset="tiny")[0]
    ep = export_program(model, 8, 2, "cpu", torch.Generator().manual_seed(0))
    assert static_graph_problems(ep) == []
    names = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("topk" in n for n in names) and any("scatter" in n for n in names)  # selection is inside

    class DataDependent(torch.nn.Module):  # negative control: the check must see nonzero
        def forward(self, images, points):
            return torch.nonzero(points[..., 0] > 10).float().sum() + PackedForward(model, 8)(images, points)[0]

    images, points = example_inputs(model.cfg, 1, 8, "cpu", torch.Generator().manual_seed(0))
    bad = torch.export.export(DataDependent(), (images, points), strict=False)
    assert any("nonzero" in p for p in static_graph_problems(bad))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cli_refuses_cuda_without_cuda(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "export" / "export.py"), "--preset", "tiny",
                           "--out", str(tmp_path / "x"), "--device", "cuda"], capture_output=True, text=True)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUDA is not available" in lines[0], proc.stderr
    assert not (tmp_path / "x" / "manifest.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--checkpoint", "/nonexistent/run"], "no such file"),
    (["--preset", "huge"], "unknown preset"),
    (["--preset", "tiny", "--buckets", "64,8"], "strictly ascending"),
    (["--preset", "tiny", "--buckets", "8,128"], "more than the 64 patches"),
    (["--preset", "tiny", "--buckets", "8,x"], "comma-separated"),
    (["--preset", "tiny", "--dtype", "int8"], "invalid choice"),
    (["--preset", "tiny", "--batch", "0"], "--batch 0"),
    (["--preset", "tiny", "--compile-workers", "0"], "--compile-workers 0"),
    (["--preset", "tiny", "--onnx-buckets", "16", "--buckets", "8,64"], "--onnx-buckets"),
    (["--preset", "tiny", "--target", "z80"], "unknown target"),
    (["--preset", "tiny", "--target", "jetson-orin" if platform.machine() != "aarch64" else "x86_64"],
     "cannot build for target"),
    (["--preset", "tiny"], "required"),  # no --out
])
def test_cli_bad_inputs_one_line_exit_1(argv, message, tmp_path, capsys):
    if "--out" not in argv and message != "required":
        argv = argv + ["--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as e:
        sys.exit(_cli().main(argv))
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def _verifies(d: Path) -> str:
    """The folder holds a complete export that checks against its reference; returns its manifest's hash."""
    proc = subprocess.run([sys.executable, "-m", "depthpack.runtime.aoti", "--check", str(d / "manifest.json")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return sha256_file(d / "manifest.json")


def test_failed_reexport_leaves_the_previous_export(exported, tmp_path, monkeypatch):
    import depthpack.deploy.build as ex

    d = tmp_path / "deployed"
    shutil.copytree(exported.out, d)
    before = {p.name: sha256_file(p) for p in d.iterdir()}

    def broken(jobs, workers=1, on_done=None):
        raise ExportError("compiler exploded")
    monkeypatch.setattr(ex, "compile_packages", broken)
    model = load_for_export(preset="tiny", seed=1)[0]
    with pytest.raises(ExportError, match="exploded"):
        export(model, ExportOptions(out=str(d), buckets=BUCKETS), "tiny", log=lambda m: None)
    assert {p.name: sha256_file(p) for p in d.iterdir()} == before
    assert not list(tmp_path.glob(".deployed.*"))  # no staging folder left behind


def test_export_refuses_a_folder_that_is_not_an_export(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    model = load_for_export(preset="tiny")[0]
    with pytest.raises(ExportError, match="not a depthpack export"):
        export(model, ExportOptions(out=str(tmp_path), buckets=(8,)), "tiny", log=lambda m: None)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with pytest.raises(ExportError, match="is a file"):
        export(model, ExportOptions(out=str(tmp_path / "notes.txt"), buckets=(8,)), "tiny", log=lambda m: None)


@pytest.mark.slow
def test_reexport_killed_at_any_moment_leaves_a_complete_export(exported, tmp_path):
    """A robot re-exports in place and the power goes: whenever the kill lands, the folder holds the
    old complete export or the new one, and the next export cleans up after the killed one."""
    d = tmp_path / "deployed"
    shutil.copytree(exported.out, d)
    old = _verifies(d)
    cmd = [sys.executable, str(ROOT / "export" / "export.py"), "--preset", "tiny", "--out", str(d),
           "--buckets", ",".join(map(str, BUCKETS)), "--seed", "1"]
    seen = set()
    for delay in (2.0, 9.0, 18.0, 600.0):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        seen.add(_verifies(d))
    assert old in seen and len(seen) == 2  # the killed runs left the old one; the last finished the new one
    assert not list(tmp_path.glob(".deployed.*"))  # stale staging folders were removed by the next export


# ---- frame packages: camera frames in, preprocessing inside ------------------------------------------
@pytest.fixture(scope="module")
def exported_frames(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_frames") / "cam"
    model, preset = load_for_export(preset="tiny", seed=0)
    export(model, ExportOptions(out=str(out), buckets=(8,), onnx=True, frame_size=(48, 80), frame_format="bgr8"),
           preset, log=lambda m: None)
    return SimpleNamespace(out=out, model=model, manifest=read_manifest(out / "manifest.json"))


def test_frame_packages_take_raw_frames(exported_frames):
    from depthpack.deploy.package import PackedForward
    from depthpack.runtime.predictor import Predictor

    m, out = exported_frames.manifest, exported_frames.out
    assert m["frame"] == {"size": [48, 80], "color": "bgr"}
    assert m["buckets"][0]["inputs"][0] == {"name": "frames", "shape": [1, 48, 80, 3], "dtype": "uint8"}
    ref = load_file(str(out / "reference.safetensors"))
    assert ref["frames"].dtype == torch.uint8 and ref["frames"].shape == (1, 48, 80, 3)
    # the reference's frame is reference.png's pixels in BGR order, its points the CSV's (frame pixels)
    png = torch.from_numpy(np.ascontiguousarray(cv2_read_bgr(out / "reference.png")))
    assert torch.equal(ref["frames"][0], png)
    _, runners = load_runners(out / "manifest.json", "cpu")
    g = torch.Generator().manual_seed(3)
    frames = torch.randint(0, 256, (1, 48, 80, 3), dtype=torch.uint8, generator=g)
    pts = torch.rand(1, 8, 2, generator=g) * torch.tensor([79.9, 47.9])
    with torch.no_grad():
        want = PackedForward(exported_frames.model, 8, m["frame"])(frames, pts)
    torch.testing.assert_close(runners[8](frames, pts), want, atol=1e-4, rtol=1e-4)
    # the Predictor over the packages equals the Predictor's own frame path (same preprocessing)
    packaged = Predictor.from_packages(out / "manifest.json", device="cpu")
    eager = Predictor(with_buckets(exported_frames.model, (8,)), device="cpu", recipe="reference", color="bgr")
    frame = frames[0].numpy()
    pts11 = pts[0, :5].numpy()
    torch.testing.assert_close(packaged.predict(frame, pts11), eager.predict(frame, pts11), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="take bgr frames of 48x80.*got bgr frames of 64x64"):
        packaged.predict(np.zeros((64, 64, 3), np.uint8), pts11)


def test_frame_onnx_equals_eager(exported_frames):
    import onnxruntime as ort

    from depthpack.deploy.package import PackedForward

    sess = ort.InferenceSession(str(exported_frames.out / "depthpack_k8.onnx"), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(4)
    frames = torch.randint(0, 256, (1, 48, 80, 3), dtype=torch.uint8, generator=g)
    pts = torch.rand(1, 8, 2, generator=g) * torch.tensor([79.9, 47.9])
    got = sess.run(["depth"], {"frames": frames.numpy(), "points": pts.numpy()})[0]
    with torch.no_grad():
        want = PackedForward(exported_frames.model, 8, exported_frames.manifest["frame"])(frames, pts)[0]
    torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=1e-4)


def test_package_named_for_another_bucket_is_refused(exported, tmp_path):
    """An entry for bucket 8 naming the bucket-64 package, with that package's sha256 (and bucket 8's
    shapes, so the manifest itself is consistent): the package's own metadata gives it away."""
    d = tmp_path / "swapped"
    shutil.copytree(exported.out, d)
    m = json.loads((d / "manifest.json").read_text())
    m["buckets"][0].update(file=m["buckets"][1]["file"], sha256=m["buckets"][1]["sha256"])
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match="package of bucket 64.*manifest lists it for bucket 8"):
        load_runners(d / "manifest.json", "cpu")


def cv2_read_bgr(path):
    import cv2
    return cv2.imread(str(path), cv2.IMREAD_COLOR)


def test_packages_carry_their_own_cxx_runtime(exported, tmp_path):
    """The packages' library links the C++ runtime in (hidden), so it cannot bind half its C++ symbols
    to another copy in the loading process (the torch 2.11 + CUDA crash): no libstdc++ among its
    needed libraries."""
    import zipfile

    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    with zipfile.ZipFile(exported.out / "depthpack_k8.pt2") as z:
        so = next(n for n in z.namelist() if n.endswith(".so"))
        z.extract(so, tmp_path)
    needed = subprocess.run([readelf, "-d", str(tmp_path / so)], capture_output=True, text=True).stdout
    assert "NEEDED" in needed and "libstdc++" not in needed, needed


# ---- weights outside the packages -----------------------------------------------------------------
def test_reuse_packages_takes_new_weights_without_a_compile(exported, tmp_path):
    """A retrained model of the same config: the earlier export's packages, byte for byte, run the NEW
    weights (equal to its eager forward, unequal to the old model's) and nothing is compiled."""
    new_model, preset = load_for_export(preset="tiny", seed=7)
    out = tmp_path / "v2"
    summary = export(new_model, ExportOptions(out=str(out), buckets=BUCKETS, reuse_packages=str(exported.out)),
                     preset, log=lambda m: None)
    assert summary["times"]["compile_s"] == {} and summary["check"]["reference"]["ok"]
    m = json.loads((out / "manifest.json").read_text())
    for b, old in zip(m["buckets"] + [m["map"]], exported.manifest["buckets"] + [exported.manifest["map"]]):
        assert b["sha256"] == old["sha256"] and (out / b["file"]).read_bytes() == (exported.out / b["file"]).read_bytes()
    assert m["weights"]["sha256"] != exported.manifest["weights"]["sha256"]
    _, runners = load_runners(out / "manifest.json", "cpu")
    for k, fn in runners.items():
        images, points = fresh_inputs(k, seed=300 + k)
        got = fn(images, points)[0]
        with torch.no_grad():
            want, old = new_model.packed_core(images, points, k), exported.model.packed_core(images, points, k)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert (got - old).abs().max() > 1e-2  # the weights really changed
    # in place: the folder's own packages, copied into the staging folder before it replaces them
    before = {b["file"]: b["sha256"] for b in m["buckets"]}
    export(exported.model, ExportOptions(out=str(out), buckets=BUCKETS, reuse_packages=str(out)), preset, log=lambda m: None)
    m = json.loads((out / "manifest.json").read_text())
    assert {b["file"]: b["sha256"] for b in m["buckets"]} == before
    assert m["weights"]["sha256"] == exported.manifest["weights"]["sha256"]  # the first model's weights again


@pytest.mark.parametrize("opts, preset_seed, message", [
    ({"dtype": "bfloat16"}, 0, "its dtype is \"float32\", this export's is \"bfloat16\""),
    ({"buckets": (8,)}, 0, "its model_config.buckets is \\[8, 64\\], this export's is \\[8\\]"),
    ({"batch": 2}, 0, "its batch_size is 1"),
])
def test_reuse_packages_of_another_model_or_build_is_refused(exported, tmp_path, opts, preset_seed, message):
    model, preset = load_for_export(preset="tiny", seed=preset_seed)
    out = tmp_path / "out"
    with pytest.raises(ExportError, match=message):
        export(model, ExportOptions(out=str(out), **{"buckets": BUCKETS, **opts}, reuse_packages=str(exported.out)),
               preset, log=lambda m: None)
    assert not out.exists()


def test_reuse_packages_refusals(exported, tmp_path):
    model, preset = load_for_export(preset="tiny", seed=0)
    d = tmp_path / "inside"
    shutil.copytree(exported.out, d)
    m = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps(dict(m, weights=None)))
    with pytest.raises(ExportError, match="hold their weights"):
        export(model, ExportOptions(out=str(tmp_path / "a"), buckets=BUCKETS, reuse_packages=str(d)), preset)
    with pytest.raises(ExportError, match="no such file"):
        export(model, ExportOptions(out=str(tmp_path / "a"), buckets=BUCKETS, reuse_packages=str(tmp_path / "none")), preset)
    (d / "manifest.json").write_text(json.dumps(m))
    (d / "depthpack_k64.pt2").write_bytes(b"changed")
    with pytest.raises(ExportError, match="sha256 mismatch"):
        export(model, ExportOptions(out=str(tmp_path / "a"), buckets=BUCKETS, reuse_packages=str(d)), preset)
    assert not (tmp_path / "a").exists()


def _rewrite_weights(d, change) -> None:
    """weights.safetensors with change(weights) applied, and the manifest's sha256 made to match: only the
    packages' own record of their constants can catch it (a hand-edited or half-migrated export)."""
    from safetensors.torch import save_file

    weights = load_file(str(d / "weights.safetensors"))
    change(weights)
    save_file(weights, str(d / "weights.safetensors"))
    m = json.loads((d / "manifest.json").read_text())
    m["weights"]["sha256"] = sha256_file(d / "weights.safetensors")
    (d / "manifest.json").write_text(json.dumps(m))


QKV = "model.backbone.blocks.0.attn.qkv.weight"


@pytest.mark.parametrize("change, message", [
    (lambda w: w.pop("model.head.mlp.3.bias"), "lack constant model.head.mlp.3.bias that package depthpack_k8.pt2"),
    (lambda w: w.update({QKV: w[QKV][:, :-1].contiguous()}), f"constant {QKV} is float32 \\[192, 63\\].*expects float32 \\[192, 64\\]"),
    (lambda w: w.update({QKV: w[QKV].T.contiguous()}), f"constant {QKV} is float32 \\[64, 192\\]"),
    (lambda w: w.update({QKV: torch.cat([w[QKV], w[QKV]])}), f"constant {QKV} is float32 \\[384, 64\\]"),
    (lambda w: w.update({QKV: w[QKV].to(torch.bfloat16)}), f"constant {QKV} is bfloat16 \\[192, 64\\], .* expects float32"),
], ids=["missing", "narrower", "transposed", "larger", "dtype"])
def test_weights_that_do_not_fit_the_packages_are_refused(exported, tmp_path, change, message):
    """A weights file whose sha256 matches the manifest but whose tensors do not fit the packages: refused
    at load with the constant named, before any package runs (threads or heaps never see it)."""
    d = tmp_path / "w"
    shutil.copytree(exported.out, d)
    _rewrite_weights(d, change)
    with pytest.raises(ValueError, match=message):
        load_runners(d / "manifest.json", "cpu")


def test_weights_file_tampered_is_refused(exported, tmp_path):
    from safetensors.torch import save_file

    d = tmp_path / "w"
    shutil.copytree(exported.out, d)
    weights = load_file(str(d / "weights.safetensors"))
    first = next(iter(weights))
    weights[first] = weights[first] + 1
    save_file(weights, str(d / "weights.safetensors"))
    with pytest.raises(ValueError, match="weights .*sha256 mismatch"):
        load_runners(d / "manifest.json", "cpu")
