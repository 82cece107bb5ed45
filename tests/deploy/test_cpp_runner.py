"""The C++ runner (deploy_cpp: the depthpack library, depthpack_run, robot_loop) against Python, on the CPU.

Builds deploy_cpp with CMake against the libtorch of the installed wheel (about a minute on 2 cores;
DEPTHPACK_BUILD=DIR builds into (and reuses) DIR; DEPTHPACK_RUN=/path/to/depthpack_run skips the
build, robot_loop is then taken from the same folder: CI's ASan/UBSan run, deploy_cpp/fuzz/asan.sh),
exports the tiny preset with export/export.py (buckets 8 and 16, so that every chunking case is
cheap; DEPTHPACK_EXPORTS=DIR keeps the exports in DIR and reuses those already there, so that CI's
sanitizer run does not export again), and checks that:
  - the marked lists of deploy_cpp/manifest.h are depthpack.deploy.contract's;
  - `--check reference.safetensors` passes and the runner's depths equal Python's eager packed
    forward (chunked by the same rule) within the manifest's tolerance, for Q below, at and above
    the bucket sizes, including Q > the largest bucket (chunks);
  - image files and frames (raw, a folder, a video) go through Python's one preprocessing
    (bilinear resize of float32 RGB, not cv::resize), a corrupt frame is named and skipped;
  - robot_loop, the example that links the library, gives the CLI's depths;
  - a build without OpenCV still builds and runs raw frames; the tests ask the binary what it has
    (--version), never guess it from an error message;
  - a weights file whose sha256 matches but whose tensors do not fit the packages (another shape,
    dtype or size) is refused at load, naming the constant and the package;
  - --out never writes over an input or into the export folder;
  - every bad input is one line on stderr and exit code 1, and nothing hangs.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
BUCKETS = (8, 16)
pytestmark = pytest.mark.slow  # one CMake build + one export per module


def run(runner: Path, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(runner), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def build_runner(build_dir: Path, *cmake_args: str, target: str | None = None) -> Path:
    """Configure and build deploy_cpp into build_dir; a failed build fails the tests with CMake's words."""
    if shutil.which("cmake") is None:
        pytest.fail("cmake is not installed (apt-get install cmake)")
    prefix = torch.utils.cmake_prefix_path
    for cmd in (["cmake", "-S", ROOT / "deploy_cpp", "-B", build_dir, f"-DCMAKE_PREFIX_PATH={prefix}", *cmake_args],
                ["cmake", "--build", build_dir, "-j", str(min(4, os.cpu_count() or 1)), *(["--target", target] if target else [])]):
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
        if proc.returncode:
            pytest.fail(f"{' '.join(map(str, cmd[:2]))} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return build_dir / "depthpack_run"


FRAME = (80, 96)  # (h, w) of the frame packages' camera frames


def start_export(out: Path, device: str = "cpu", frame: bool = False,
                 model: str | None = None) -> subprocess.Popen:
    cmd = [sys.executable, ROOT / "export" / "export.py", "--preset", "tiny", "--out", out, "--device", device,
           "--buckets", ",".join(map(str, BUCKETS))] + \
          (["--frame-size", f"{FRAME[1]}x{FRAME[0]}", "--frame-format", "bgr8"] if frame else []) + \
          (["--model", model] if model else [])
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_export(proc: subprocess.Popen | None, out: Path) -> Path:
    if proc is None:  # kept from an earlier run (DEPTHPACK_EXPORTS)
        return out
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"export failed:\n{err[-4000:]}"
    return out


def export_dir(tmp_path_factory, name: str) -> Path:
    """Where the export `name` goes: $DEPTHPACK_EXPORTS/name, else a fresh temporary folder."""
    keep = os.environ.get("DEPTHPACK_EXPORTS")
    return Path(keep) / name if keep else tmp_path_factory.mktemp("export") / name


def start_kept_export(out: Path, **kwargs) -> subprocess.Popen | None:
    """start_export, unless out already holds a finished export (the exporter writes its manifest last)."""
    return None if (out / "manifest.json").is_file() else start_export(out, **kwargs)


_RUNNER: dict[str, Path] = {}


def get_runner(tmp_path_factory) -> Path:
    """$DEPTHPACK_RUN, or the runner built once per module (into $DEPTHPACK_BUILD if set)."""
    if "runner" not in _RUNNER:
        if os.environ.get("DEPTHPACK_RUN"):
            _RUNNER["runner"] = Path(os.environ["DEPTHPACK_RUN"])
        else:
            build = os.environ.get("DEPTHPACK_BUILD")
            _RUNNER["runner"] = build_runner(Path(build) if build else tmp_path_factory.mktemp("cpp") / "build")
    return _RUNNER["runner"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(runner binary, tiny CPU export, the same as frame packages): the exports run while the
    runner compiles."""
    out, frames_out = export_dir(tmp_path_factory, "tiny"), export_dir(tmp_path_factory, "tiny_frames")
    exports = [start_kept_export(out), start_kept_export(frames_out, frame=True)]
    try:
        runner = get_runner(tmp_path_factory)
    finally:
        done = [finish_export(exports[0], out), finish_export(exports[1], frames_out)]
    return runner, *done


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Path:
    return get_runner(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(built) -> Path:
    return built[1]


@pytest.fixture(scope="module")
def frames_exported(built) -> Path:
    """Packages that take uint8 BGR frames of FRAME's size and preprocess inside (manifest "frame")."""
    return built[2]


@pytest.fixture(scope="module")
def thumbnail_exported(runner, tmp_path_factory) -> Path:
    """A model with thumbnail anchors: no glance depth, the direct head, packages with one output."""
    out = export_dir(tmp_path_factory, "tiny_thumbnail")
    return finish_export(start_kept_export(out, model="context=thumbnail"), out)


@pytest.fixture(scope="module")
def shared_exported(runner, tmp_path_factory) -> Path:
    """The default layout on the shared glance stream: packages with a map and no map-only package."""
    out = export_dir(tmp_path_factory, "tiny_shared")
    return finish_export(start_kept_export(out, model="glance_stream=shared"), out)


@pytest.fixture(scope="module")
def example(runner) -> Path:
    path = runner.parent / "robot_loop"
    assert path.exists(), f"{path}: the example robot_loop is built beside depthpack_run"
    return path


@pytest.fixture(scope="module")
def python_depth():
    """Python's answer: the eager packed forward of the same seeded weights, chunked like the runner."""
    from depthpack.core.packing import run_chunked
    from depthpack.deploy.build import load_for_export

    model, _ = load_for_export(None, "tiny", 0)

    def depth(images: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return run_chunked(model.packed_core, images, points, BUCKETS)
    return depth


@pytest.fixture(scope="module")
def python_frame_depth():
    """Python's answer for the frame packages: their exported function (preprocessing inside), eager,
    chunked like the runner; frames uint8 BGR [B,h,w,3], points [B,Q,2] in frame pixels."""
    from depthpack.core.packing import run_chunked
    from depthpack.deploy.build import load_for_export
    from depthpack.deploy.package import PackedForward

    model, _ = load_for_export(None, "tiny", 0)
    frame = {"size": list(FRAME), "color": "bgr"}

    def depth(frames: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return run_chunked(lambda x, p, k: PackedForward(model, k, frame)(x, p)[0], frames, points, BUCKETS)
    return depth


def model_input(bgr: np.ndarray, size) -> torch.Tensor:
    """The one preprocessing, depthpack.core.preprocess: uint8 BGR [h,w,3] -> float32 RGB [1,3,H,W]."""
    from depthpack.core.preprocess import frames_to_images

    return frames_to_images(torch.from_numpy(np.ascontiguousarray(bgr))[None], tuple(size), "bgr")


def frame_depth(python_depth, bgr: np.ndarray, pts, size) -> np.ndarray:
    """Python's depths at points (x, y) in the frame's pixels (preprocess.scale_points to the model's)."""
    from depthpack.core.preprocess import scale_points

    xy = scale_points(np.asarray(pts, np.float32), bgr.shape[:2], tuple(size))
    return python_depth(model_input(bgr, size), xy[None])[0].numpy()


def noise_frames(n: int, h: int = 80, w: int = 96, seed: int = 0) -> np.ndarray:
    """uint8 BGR frames [n,h,w,3]: smooth noise, so that depths vary and resizing matters."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (n, h // 8 + 1, w // 8 + 1, 3)).astype(np.float32)
    fine = rng.normal(0, 24, (n, h, w, 3))
    up = torch.nn.functional.interpolate(torch.from_numpy(coarse).permute(0, 3, 1, 2), size=(h, w), mode="bilinear")
    return np.clip(up.permute(0, 2, 3, 1).numpy() + fine, 0, 255).astype(np.uint8)


def frame_points(h: int, w: int, n: int = 20, seed: int = 1) -> np.ndarray:
    pts = np.random.default_rng(seed).uniform(0, 1, (n, 2)) * [w - 1e-3, h - 1e-3]
    return np.asarray(pts, np.float32).astype(np.float64)  # exactly representable as float32


def read_frames_out(path: Path) -> np.ndarray:
    text = path.read_text().splitlines()
    assert text[0] == "frame,x,y,depth"
    return np.array([[float(v) for v in line.split(",")] for line in text[1:]]).reshape(-1, 4)


def loop_report(stderr: str) -> dict:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("frames "))
    return dict(kv.split("=") for kv in line.split()[1:])


def manifest_of(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def tolerance(d: Path) -> tuple[float, float]:
    tol = manifest_of(d)["tolerance"]
    return tol["atol"], tol["rtol"]


def write_csv(path: Path, pts, header: bool = True, blank_lines: bool = False) -> Path:
    lines = (["x,y"] if header else []) + [f"{x!r},{y!r}" for x, y in np.asarray(pts, dtype=np.float64).tolist()]
    if blank_lines:
        lines = lines[:2] + ["", "  "] + lines[2:]
    path.write_text("\n".join(lines) + "\n")
    return path


def read_out(path: Path) -> np.ndarray:
    text = path.read_text().splitlines()
    assert text[0] == "x,y,depth"
    return np.array([[float(v) for v in line.split(",")] for line in text[1:]]).reshape(-1, 3)


def assert_close(got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> None:
    assert got.shape == want.shape
    diff = np.abs(got - want)
    assert np.all(diff <= atol + rtol * np.abs(want)), f"max abs diff {diff.max():.3g} beyond atol {atol}, rtol {rtol}"


def features(runner: Path) -> dict[str, str]:
    """What the binary was built with, as it says: {"libtorch": "2.14.1", "cuda": "0", "opencv": "1", "videoio": "0"}."""
    proc = run(runner, "--version")
    assert proc.returncode == 0 and proc.stdout.startswith("depthpack_run "), proc.stderr
    return dict(kv.split("=") for kv in proc.stdout.split()[1:])


def has_opencv(runner: Path) -> bool:
    return features(runner)["opencv"] == "1"


# ---- parity -------------------------------------------------------------------------------------------
def test_check_reference_passes(runner, exported):
    proc = run(runner, "--manifest", exported / "manifest.json", "--check", exported / "reference.safetensors")
    assert proc.returncode == 0, proc.stderr
    assert ": OK" in proc.stderr
    diff = float(proc.stderr.split("max abs diff ")[1].split()[0])
    assert diff <= tolerance(exported)[0]


def test_check_fails_on_wrong_reference(runner, exported, tmp_path):
    """--check must be able to fail: the reference's depth moved by 10x the tolerance."""
    from safetensors.torch import save_file

    ref = load_file(str(exported / "reference.safetensors"))
    ref["depth"] = ref["depth"] + 10 * sum(tolerance(exported)) * (1 + ref["depth"])
    save_file(ref, str(tmp_path / "bad.safetensors"))
    proc = run(runner, "--manifest", exported / "manifest.json", "--check", tmp_path / "bad.safetensors")
    assert proc.returncode == 1
    assert "MISMATCH" in proc.stderr


def test_check_refuses_a_reference_that_is_not_finite(runner, exported, tmp_path):
    """A NaN in the reference's depth is one error naming the file, never "max abs diff 0 ... MISMATCH"."""
    from safetensors.torch import save_file

    ref = load_file(str(exported / "reference.safetensors"))
    ref["depth"][0, 1] = float("nan")
    save_file(ref, str(tmp_path / "nan.safetensors"))
    proc = run(runner, "--manifest", exported / "manifest.json", "--check", tmp_path / "nan.safetensors")
    assert proc.returncode == 1 and "max abs diff 0" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / "nan.safetensors") in lines[0] and "not finite" in lines[0], lines


def test_the_map_comes_back_as_from_python(runner, exported, thumbnail_exported, tmp_path):
    """The default packages carry a map: the reference check compares it too, --map writes the map of the
    same call and it equals Python's runner over the same packages; thumbnail packages refuse --map."""
    from depthpack.runtime.predictor import Predictor

    manifest = exported / "manifest.json"
    proc = run(runner, "--manifest", manifest, "--check", exported / "reference.safetensors")
    assert proc.returncode == 0 and "and the map" in proc.stderr and ": OK" in proc.stderr, proc.stderr
    ref = load_file(str(exported / "reference.safetensors"))
    images = ref["images"][:1]
    pts = ref["points"][0, :11]
    csv = write_csv(tmp_path / "pts.csv", pts.numpy())
    proc = run(runner, "--manifest", manifest, "--image", exported / "reference.safetensors", "--points", csv,
               "--out", tmp_path / "depth.csv", "--map", tmp_path / "map.csv")
    assert proc.returncode == 0, proc.stderr
    depth, dmap = Predictor.from_packages(manifest, device="cpu").predict(images, pts[None], return_map=True)
    assert_close(read_out(tmp_path / "depth.csv")[:, 2], depth[0].numpy(), *tolerance(exported))
    got = np.loadtxt(tmp_path / "map.csv", delimiter=",")
    assert got.shape == tuple(manifest_of(exported)["map"]["size"]) == (32, 32)
    assert_close(got.ravel(), dmap[0].numpy().ravel(), *tolerance(exported))
    proc = run(runner, "--manifest", thumbnail_exported / "manifest.json", "--image",
               thumbnail_exported / "reference.safetensors", "--points", csv, "--map", tmp_path / "none.csv")
    assert proc.returncode == 1 and "return no map" in proc.stderr, proc.stderr


def _cpp_map(runner: Path, d: Path, image: Path, tmp_path: Path, pts=None) -> np.ndarray:
    """depthpack_run --map's map [rows,cols] float32 for the points pts (None: --map alone, no --points)."""
    out = tmp_path / f"map_{len(list(tmp_path.glob('map_*')))}.csv"
    points = ["--points", write_csv(tmp_path / "pts.csv", pts)] if pts is not None else []
    proc = run(runner, "--manifest", d / "manifest.json", "--image", image, *points, "--map", out)
    assert proc.returncode == 0 and (pts is not None or proc.stdout == ""), proc.stderr  # the map alone: no depths
    return np.loadtxt(out, delimiter=",", ndmin=2).astype(np.float32)  # "%.9g": float32 to the bit


def test_the_one_way_map_is_the_same_from_every_runner(runner, exported, tmp_path):
    """One map per image on the one-way stream: C++ with two point sets (two buckets), with an empty points
    file and with --map alone (the map-only package) gives the map of Python's packages (map-only) to the
    bit, and the eager model's glance alone within float32 rounding."""
    from depthpack.deploy.build import load_for_export
    from depthpack.runtime.predictor import Predictor

    assert manifest_of(exported)["map"]["file"] == "depthpack_map.pt2"
    image = exported / "reference.safetensors"
    images = load_file(str(image))["images"][:1]
    g = torch.Generator().manual_seed(21)
    sets = [torch.rand(n, 2, generator=g).numpy() * 63.9 for n in (5, 14)]  # buckets 8 and 16
    maps = [_cpp_map(runner, exported, image, tmp_path, p) for p in sets + [np.zeros((0, 2))]]
    maps.append(_cpp_map(runner, exported, image, tmp_path))
    _, python = Predictor.from_packages(exported / "manifest.json", device="cpu").predict(images, torch.zeros(1, 0, 2),
                                                                                           return_map=True)
    assert all(np.array_equal(m, python[0].numpy()) for m in maps)
    model, _ = load_for_export(None, "tiny", 0)
    with torch.no_grad():
        eager = model.glance_map_core(images)[0].numpy()
    assert np.abs(maps[0] - eager).max() < 1e-5


def test_a_shared_stream_map_only_call_runs_pythons_point(runner, shared_exported, tmp_path):
    """Shared stream, no map-only package: C++ and Python both run one point, the input's centre, and give
    the same map to the bit (C++ ran (0, 0), 0.029 m away); the same packages under a format 4 manifest
    (no glance_stream) check OK and answer the same."""
    from depthpack.runtime.aoti import load_runners
    from depthpack.runtime.predictor import Predictor

    m = manifest_of(shared_exported)
    assert m["model_config"]["glance_stream"] == "shared" and m["map"] == {"size": [32, 32]}
    image = shared_exported / "reference.safetensors"
    images = load_file(str(image))["images"][:1]
    got = _cpp_map(runner, shared_exported, image, tmp_path)
    _, python = Predictor.from_packages(shared_exported / "manifest.json", device="cpu").predict(
        images, torch.zeros(1, 0, 2), return_map=True)
    np.testing.assert_array_equal(got, python[0].numpy())
    _, runners = load_runners(shared_exported / "manifest.json", "cpu")
    origin = runners[8](images, torch.zeros(1, 8, 2))[1][0].numpy()
    assert np.abs(origin - got).max() > 1e-3  # the test tells the points apart
    d = tmp_path / "old"
    shutil.copytree(shared_exported, d)
    _edit_manifest(d, lambda m: (m.update(format="depthpack-manifest/4"), m["model_config"].pop("glance_stream")))
    proc = run(runner, "--manifest", d / "manifest.json", "--check", image)
    assert proc.returncode == 0 and "and the map," in proc.stderr, proc.stderr
    np.testing.assert_array_equal(_cpp_map(runner, d, image, tmp_path), got)


@pytest.mark.parametrize("q", [1, 7, 8, 9, 16, 17, 2 * 16 + 5])
def test_depths_equal_python(runner, exported, python_depth, tmp_path, q):
    """Random points in the reference tensor image (model pixels): below, at and above each bucket,
    and more than the largest bucket (three chunks: 16 + 16 + 5 padded to 8)."""
    ref = load_file(str(exported / "reference.safetensors"))
    images = ref["images"][:1]  # [1,3,H,W]
    H, W = images.shape[-2:]
    g = torch.Generator().manual_seed(q)
    pts = (torch.rand(q, 2, generator=g) * torch.tensor([W, H])).clamp(max=torch.tensor([W, H]) - 1e-3)  # [Q,2]
    pts[q // 2] = pts[0]  # a duplicate
    csv = write_csv(tmp_path / "pts.csv", pts.numpy(), blank_lines=True)
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", exported / "reference.safetensors",
               "--points", csv, "--out", tmp_path / "depth.csv")
    assert proc.returncode == 0, proc.stderr
    out = read_out(tmp_path / "depth.csv")
    np.testing.assert_array_equal(out[:, :2], pts.numpy().astype(np.float64))  # input order, as given
    want = python_depth(images, pts[None])[0].numpy()  # [Q]
    assert_close(out[:, 2], want, *tolerance(exported))
    assert np.all((out[:, 2] >= 0.1) & (out[:, 2] <= 20.0))


def test_image_file_equals_python(runner, exported, python_depth, tmp_path):
    """reference.png is larger than the model: OpenCV decode, Python's resize, point scaling."""
    if not has_opencv(runner):
        pytest.skip("runner built without OpenCV (apt-get install libopencv-imgcodecs-dev)")
    import cv2

    size = manifest_of(exported)["image_size"]
    bgr = cv2.imread(str(exported / "reference.png"), cv2.IMREAD_COLOR)
    pts0 = np.loadtxt(exported / "reference_points.csv", delimiter=",", skiprows=1, dtype=np.float64)
    assert bgr.shape[:2] != tuple(size)  # the resize path is exercised
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", exported / "reference.png",
               "--points", exported / "reference_points.csv", "--out", tmp_path / "depth.csv")
    assert proc.returncode == 0, proc.stderr
    out = read_out(tmp_path / "depth.csv")
    np.testing.assert_array_equal(out[:, :2], pts0)  # original coordinates, input order
    assert_close(out[:, 2], frame_depth(python_depth, bgr, pts0, size), *tolerance(exported))


def test_preprocessing_is_pythons_bilinear_not_cv_resize(runner, exported, python_depth, tmp_path):
    """A noisy 97x83 PNG: the runner's depths equal Python's preprocessing (float32 bilinear resize)
    to float32 rounding, and the test can tell: cv::resize's uint8 rounding moves them 100x more."""
    if not has_opencv(runner):
        pytest.skip("runner built without OpenCV")
    import cv2

    size = manifest_of(exported)["image_size"]
    bgr = noise_frames(1, 83, 97, seed=5)[0]
    cv2.imwrite(str(tmp_path / "noise.png"), bgr)
    pts = frame_points(83, 97, 24)
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", tmp_path / "noise.png",
               "--points", write_csv(tmp_path / "p.csv", pts), "--out", tmp_path / "d.csv")
    assert proc.returncode == 0, proc.stderr
    got, want = read_out(tmp_path / "d.csv")[:, 2], frame_depth(python_depth, bgr, pts, size)
    resized = cv2.resize(bgr[..., ::-1], (size[1], size[0]), interpolation=cv2.INTER_LINEAR)  # uint8 RGB
    old = python_depth(torch.from_numpy(np.ascontiguousarray(resized.transpose(2, 0, 1))).float()[None] / 255,
                       torch.from_numpy(pts.astype(np.float32))[None] * torch.tensor([size[1] / 97, size[0] / 83]))[0].numpy()
    assert np.abs(got - want).max() < 1e-5
    assert np.abs(old - want).max() > 1e-4


def test_empty_points_give_an_empty_result(runner, exported, tmp_path):
    (tmp_path / "pts.csv").write_text("x,y\n\n")
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", exported / "reference.safetensors",
               "--points", tmp_path / "pts.csv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "x,y,depth\n"


def test_bench_prints_latencies(runner, exported):
    proc = run(runner, "--manifest", exported / "manifest.json", "--check", exported / "reference.safetensors",
               "--bench", "5")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("bench ")]
    # 16 + a chunk of 3 -> 8, and the map-only package (the check's map alone)
    assert {ln.split("bucket=")[1].split()[0] for ln in lines} == {*map(str, BUCKETS), "map"}
    for ln in lines:
        fields = dict(kv.split("=") for kv in ln.split()[1:])
        assert fields["runs"] == "5" and 0 < float(fields["median_ms"]) <= float(fields["p90_ms"])


# ---- errors: one line, exit 1 -----------------------------------------------------------------------
def _edit_manifest(d: Path, fn) -> None:
    m = manifest_of(d)
    fn(m)
    (d / "manifest.json").write_text(json.dumps(m))


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _corrupt_with_sha(d: Path) -> None:
    import hashlib

    (d / "depthpack_k16.pt2").write_bytes(b"this is not a zip archive" * 100)
    sha = hashlib.sha256((d / "depthpack_k16.pt2").read_bytes()).hexdigest()
    _edit_manifest(d, lambda m: m["buckets"][1].update(sha256=sha))


def _rewrite_weights(d: Path, fn) -> None:
    """The weights file rewritten by fn (a dict of tensors, edited in place), its sha256 in the
    manifest updated: only the packages' own records of their constants can tell."""
    import hashlib

    from safetensors.torch import save_file

    w = load_file(str(d / "weights.safetensors"))
    fn(w)
    save_file(w, str(d / "weights.safetensors"))
    sha = hashlib.sha256((d / "weights.safetensors").read_bytes()).hexdigest()
    _edit_manifest(d, lambda m: m["weights"].update(sha256=sha))


def _transposed(w: dict, name: str) -> None:
    """Another shape, the same bytes count: the old runner's byte copy took it and answered wrong."""
    w[name] = w[name].t().contiguous()


def _larger(w: dict, name: str) -> None:
    """Two more rows along dim 1, in front: larger than the package's buffer, the original rows moved."""
    t = w[name]
    w[name] = torch.cat([torch.randn_like(t[:, :2]), t], 1).contiguous()


def _image_tensor(d: Path, fn) -> None:
    """bad.safetensors: the reference's "images" through fn."""
    from safetensors.torch import save_file

    save_file({"images": fn(load_file(str(d / "reference.safetensors"))["images"]).contiguous()}, str(d / "bad.safetensors"))


def _set_metadata(pt2: Path, meta: dict) -> str:
    """Set (or, with None, remove) keys of a package's own metadata (the file Inductor's
    aot_inductor.metadata config writes, which AOTIModelPackageLoader::get_metadata reads); returns
    the package's new sha256."""
    import hashlib
    import zipfile

    tmp = pt2.with_suffix(".tmp")
    with zipfile.ZipFile(pt2) as zin, zipfile.ZipFile(tmp, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("_metadata.json"):
                merged = {**json.loads(data), **meta}
                data = json.dumps({k: v for k, v in merged.items() if v is not None}).encode()
            zout.writestr(item, data)
    tmp.replace(pt2)
    return hashlib.sha256(pt2.read_bytes()).hexdigest()


def _with_package_metadata(d: Path, fn=lambda m: None) -> None:
    """Each package's depthpack.bucket / depthpack.inputs written anew (what the exporter writes; the
    rewrite changes the package's bytes), then fn edits the manifest."""
    def edit(m):
        for b in m["buckets"]:
            b["sha256"] = _set_metadata(d / b["file"], {"depthpack.bucket": str(b["bucket"]),
                                                        "depthpack.inputs": json.dumps(b["inputs"])})
        fn(m)
    _edit_manifest(d, edit)


def _swap_bucket_8_to_k16(m: dict) -> None:
    """The entry of bucket 8 names the bucket-16 package, with its sha256 and bucket 8's shapes."""
    m["buckets"][0].update(file=m["buckets"][1]["file"], sha256=m["buckets"][1]["sha256"])


def _packages(m: dict) -> list[dict]:
    """The manifest's package entries: each bucket's, and the map-only package's where it has one."""
    return m["buckets"] + ([m["map"]] if "file" in (m.get("map") or {}) else [])


def _as_frame_package(m: dict, size=(48, 40), color="bgr") -> None:
    """A manifest of packages that take raw frames uint8 [B,h,w,3] (never loaded by these tests)."""
    m["frame"] = {"size": list(size), "color": color}
    for b in _packages(m):
        b["inputs"][0] = {"name": "frames", "shape": [m["batch_size"], *size, 3], "dtype": "uint8"}


def _with_focal(m: dict, default=None) -> None:
    m["focal"] = {"default": default}
    for b in _packages(m):
        b["inputs"].append({"name": "focal", "shape": [m["batch_size"]], "dtype": "float32"})


def _bad_images(d: Path, n_nan: int = 0, n_out: int = 0) -> None:
    from safetensors.torch import save_file

    ref = load_file(str(d / "reference.safetensors"))
    img = ref["images"].clone()
    img.view(-1)[:n_nan] = float("nan")
    img.view(-1)[n_nan:n_nan + n_out] = 1.5
    save_file({"images": img}, str(d / "bad.safetensors"))


def _raw_frames(d: Path, h: int = 64, w: int = 64) -> None:
    noise_frames(2, h, w).tofile(d / "frames.raw")


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


DEFAULT_PTS = "x,y\n" + "\n".join(f"{i}.5,{2 * i}.25" for i in range(10)) + "\n"  # 10 points -> bucket 16
ERRORS = {  # name: (edit of a copy of the export dir d, points CSV text or None, extra args (callables get d), expected words)
    "tampered package": (lambda d: _flip_byte(d / "depthpack_k16.pt2"), None, [], ["depthpack_k16.pt2", "sha256", "does not match"]),
    "missing package": (lambda d: (d / "depthpack_k16.pt2").unlink(), None, [], ["depthpack_k16.pt2", "no such file"]),
    "corrupt package": (_corrupt_with_sha, None, [], ["depthpack_k16.pt2", "cannot be loaded"]),
    "malformed manifest": (lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text()[:-40]), None, [], ["manifest", "invalid JSON"]),
    "manifest without buckets": (lambda d: _edit_manifest(d, lambda m: m.pop("buckets")), None, [], ['missing key "buckets"']),
    "manifest shapes": (lambda d: _edit_manifest(d, lambda m: m.update(image_size=[32, 64])), None, [], ["shape", "differs"]),
    "missing manifest": (lambda d: (d / "manifest.json").unlink(), None, [], ["manifest", "cannot be read"]),
    "manifest format": (lambda d: _edit_manifest(d, lambda m: m.update(format="depthpack-manifest/1")), None, [], ["not a depthpack-manifest/5", "re-export"]),
    "manifest file path": (lambda d: _edit_manifest(d, lambda m: m["buckets"][0].update(file="../x.pt2")), None, [], ["plain file name"]),
    # the weights beside the weight-free packages
    "tampered weights": (lambda d: _flip_byte(d / "weights.safetensors"), None, [], ["weights.safetensors", "sha256", "does not match"]),
    "missing weights": (lambda d: (d / "weights.safetensors").unlink(), None, [], ["weights", "cannot be read"]),
    "weights path": (lambda d: _edit_manifest(d, lambda m: m["weights"].update(file="../w.safetensors")), None, [], ['"weights" must be {"file"']),
    "weights null": (lambda d: _edit_manifest(d, lambda m: m.update(weights=None)), None, [], ['"weights" is null', "older export", "re-export"]),
    "weights lack a constant": (lambda d: _rewrite_weights(d, lambda w: w.pop("model.head.mlp.3.bias")), None, [],
                                ['lacks constant "model.head.mlp.3.bias"', "depthpack_k16.pt2", "re-export"]),
    # a weights file whose sha256 the manifest vouches for, but whose tensors do not fit the packages
    "weights of another shape": (lambda d: _rewrite_weights(d, lambda w: _transposed(w, "model.head.tok.weight")), None, [],
                                 ['constant "model.head.tok.weight" with shape [64,32]', "depthpack_k16.pt2 expects [32,64]"]),
    "weights of another dtype": (lambda d: _rewrite_weights(d, lambda w: w.update({"model.head.tok.weight": w["model.head.tok.weight"].bfloat16()})),
                                 None, [], ['constant "model.head.tok.weight" as bfloat16', "depthpack_k16.pt2 expects float32"]),
    "weights with a larger tensor": (lambda d: _rewrite_weights(d, lambda w: _larger(w, "model.backbone.pos_embed")), None, [],
                                     ['constant "model.backbone.pos_embed" with shape [1,67,64]', "depthpack_k16.pt2 expects [1,65,64]"]),
    "package without its constants record": (lambda d: _edit_manifest(d, lambda m: m["buckets"][1].update(sha256=_set_metadata(
        d / "depthpack_k16.pt2", {"depthpack.constants": None}))), None, [],
        ["depthpack_k16.pt2", "no depthpack.constants metadata", "older depthpack", "re-export"]),
    "unknown input name": (lambda d: _edit_manifest(d, lambda m: m["buckets"][0]["inputs"][1].update(name="depth_hint")), None, [], ['"depth_hint"', "not one this runner can feed"]),
    "other arch": (lambda d: _edit_manifest(d, lambda m: m.update(arch="aarch64" if m["arch"] != "aarch64" else "x86_64")), None, [], ["built for", "export on this machine"]),
    "other torch": (lambda d: _edit_manifest(d, lambda m: m.update(torch_version="2.9.0+cu128")), None, [], ["built with torch 2.9.0+cu128", "libtorch", "tied to the torch"]),
    "point outside": (None, "x,y\n1,2\n64,3\n", [], ["line 3", "outside the 64x64 image"]),
    "negative point": (None, "1,2\n-0.5,3\n", [], ["line 2", "outside"]),
    "malformed line": (None, "x,y\n1,2\n\n3;4\n", [], ["line 4", 'expected "x,y"']),
    "three columns": (None, "1,2,3\n", [], ["line 1", 'expected "x,y"']),
    "nan point": (None, "nan,2\n", [], ["line 1", "not finite"]),
    # fuzz_points' finding (deploy_cpp/fuzz/regressions/points/y_beyond_float32.csv): read as inf in float32
    "point beyond float32": (None, "x,y\n45.25," + "4" * 112 + "\n", [], ["line 2", "beyond float32's range"]),
    "hex point": (None, "0x10,2\n", [], ["line 1", 'expected "x,y"']),  # strtod reads it, Python's float does not
    "unreadable image": (None, "1,2\n", ["--image", "/nonexistent/image.safetensors"], ["image", "cannot be read"]),
    "unknown flag": (None, "1,2\n", ["--frobnicate"], ["unknown argument", "--frobnicate"]),
    # nothing hangs: devices, FIFOs, folders and huge files are refused before reading
    "points /dev/zero": (None, None, ["--points", "/dev/zero"], ["points /dev/zero", "character device, not a regular file"]),
    "points folder": (None, None, ["--points", lambda d: d], ["points", "directory, not a regular file"]),
    "points FIFO": (lambda d: os.mkfifo(d / "fifo"), None, ["--points", lambda d: d / "fifo"], ["FIFO, not a regular file"]),
    "points too large": (lambda d: _sparse(d / "big.csv", 65 << 20), None, ["--points", lambda d: d / "big.csv"], ["big.csv", "64 MiB limit"]),
    "manifest /dev/zero": (None, None, ["--manifest", "/dev/zero"], ["manifest /dev/zero", "character device"]),
    "manifest FIFO": (lambda d: os.mkfifo(d / "m.json"), None, ["--manifest", lambda d: d / "m.json"], ["manifest", "FIFO"]),
    "manifest too large": (lambda d: _sparse(d / "m.json", 17 << 20), None, ["--manifest", lambda d: d / "m.json"], ["manifest", "16 MiB limit"]),
    "image folder": (lambda d: (d / "x.safetensors").mkdir(), None, ["--image", lambda d: d / "x.safetensors"], ["x.safetensors", "directory"]),
    "image /dev/zero": (None, None, ["--image", "/dev/zero"], ["/dev/zero", "character device"]),
    "check FIFO": (lambda d: os.mkfifo(d / "ref.safetensors"), None, ["--check", lambda d: d / "ref.safetensors"], ["ref.safetensors", "FIFO"]),
    "check /dev/zero": (None, None, ["--check", "/dev/zero"], ["/dev/zero", "character device"]),
    # tensor images as the Python API: finite and in [0, 1], naming how many are not
    "nan image": (lambda d: _bad_images(d, n_nan=3), None, ["--image", lambda d: d / "bad.safetensors"], ["3 non-finite values"]),
    "image out of range": (lambda d: _bad_images(d, n_out=5), None, ["--image", lambda d: d / "bad.safetensors"], ["[0,1]", "5 values outside"]),
    "image tensor of batch 2": (lambda d: _image_tensor(d, lambda t: t.repeat(2, 1, 1, 1)), None, ["--image", lambda d: d / "bad.safetensors"],
                                ['"images" holds 2 images', "--image takes one"]),
    "image tensor of uint8": (lambda d: _image_tensor(d, lambda t: (t * 255).to(torch.uint8)), None, ["--image", lambda d: d / "bad.safetensors"],
                              ['"images" has dtype U8', "F32"]),
    "image tensor of another size": (lambda d: _image_tensor(d, lambda t: t[..., :32, :]), None, ["--image", lambda d: d / "bad.safetensors"],
                                     ['"images" has shape [1,3,32,64]', "[N,3,64,64]", "not resized"]),
    # strict JSON (nlohmann/json, with duplicate keys and deep nesting refused)
    "manifest duplicate key": (lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text().replace('"arch"', '"arch": "x", "arch"', 1)),
                               None, [], ["manifest", "invalid JSON", 'duplicate key "arch"']),
    "manifest nested deeply": (lambda d: _edit_manifest(d, lambda m: m.update(preset=json.loads("[" * 80 + "]" * 80))), None, [],
                               ["manifest", "invalid JSON", "nested deeper than 64"]),
    "manifest control characters": (lambda d: _edit_manifest(d, lambda m: m.update(device="cu\nda\r")), None, [], ['got "cu\\x0ada\\x0d"']),
    # the bucket-to-file mapping, held to each package's own metadata
    "bucket 8 names the k16 package": (lambda d: _with_package_metadata(d, _swap_bucket_8_to_k16), "x,y\n1,2\n3,4\n", [],
                                       ["depthpack_k16.pt2", "built for bucket 16", "as bucket 8"]),
    "package without metadata": (lambda d: _edit_manifest(d, lambda m: m["buckets"][1].update(sha256=_set_metadata(
        d / "depthpack_k16.pt2", {"depthpack.bucket": None, "depthpack.inputs": None}))), None, [],
        ["depthpack_k16.pt2", "no depthpack.bucket / depthpack.inputs metadata", "re-export"]),
    "package inputs metadata": (lambda d: _edit_manifest(d, lambda m: m["buckets"][1].update(sha256=_set_metadata(
        d / "depthpack_k16.pt2", {"depthpack.bucket": "16", "depthpack.inputs": json.dumps(m["buckets"][0]["inputs"])}))),
        None, [], ["depthpack_k16.pt2", "takes inputs", "points float32 [1,8,2]", "for bucket 16"]),
    # the map-only package: loaded on a map-only call (--map, no points), held to the manifest like the buckets'
    "tampered map package": (lambda d: _flip_byte(d / "depthpack_map.pt2"), "x,y\n", ["--map", lambda d: d.parent / "m.csv"],
                             ["depthpack_map.pt2", "sha256", "does not match"]),
    "map package named for a bucket": (lambda d: _edit_manifest(d, lambda m: m["map"].update(sha256=_set_metadata(
        d / "depthpack_map.pt2", {"depthpack.bucket": "8"}))), "x,y\n", ["--map", lambda d: d.parent / "m.csv"],
        ["depthpack_map.pt2", "built for bucket 8", "as bucket map"]),
    "map package in a format 4 manifest": (lambda d: _edit_manifest(d, lambda m: m.update(format="depthpack-manifest/4")), None, [],
                                           ["map: a map-only package needs format depthpack-manifest/5"]),
    "map package of a shared model": (lambda d: _edit_manifest(d, lambda m: m["model_config"].update(glance_stream="shared")), None, [],
                                      ["map: a map-only package needs the one-way glance stream"]),
    "map package without its sha256": (lambda d: _edit_manifest(d, lambda m: m["map"].pop("sha256")), None, [],
                                       ['map: missing key "sha256" of the map-only package']),
    "map package with points": (lambda d: _edit_manifest(d, lambda m: m["map"]["inputs"].append(m["buckets"][0]["inputs"][1])), None, [],
                                ["the map-only package's tensors", "without the points"]),
    # frame packages, focal
    "frame of another size": (lambda d: (_raw_frames(d), _edit_manifest(d, _as_frame_package)), None,
                              ["--raw", lambda d: d / "frames.raw", "--frame-size", "64x64"], ["frame is 64x64", "take 40x48 frames"]),
    "frames with frame null": (lambda d: _edit_manifest(d, lambda m: (_as_frame_package(m), m.update(frame=None))), None, [], ['"frames" needs', '"frame"']),
    "focal missing": (lambda d: _edit_manifest(d, _with_focal), None, [], ["take a focal length", "--focal"]),
    "focal not positive": (lambda d: _edit_manifest(d, lambda m: _with_focal(m, 500.0)), None, ["--focal", "-3"], ["--focal must be a positive", '"-3"']),
    "focal zero": (None, None, ["--focal", "0"], ["--focal must be a positive", '"0"']),  # refused even where it would be ignored
    "focal not finite": (None, None, ["--focal", "inf"], ["--focal needs a number", '"inf"']),
    # frame loops
    "raw without size": (_raw_frames, None, ["--raw", lambda d: d / "frames.raw"], ["--raw and --frame-size"]),
    "bad frame size": (_raw_frames, None, ["--raw", lambda d: d / "frames.raw", "--frame-size", "64by64"], ["--frame-size must be WIDTHxHEIGHT"]),
    "raw folder": (None, None, ["--raw", lambda d: d, "--frame-size", "64x64"], ["raw frames", "is a directory"]),
    "empty raw": (lambda d: (d / "e.raw").write_bytes(b""), None, ["--raw", lambda d: d / "e.raw", "--frame-size", "64x64"], ["no frames in"]),
    "images without images": (lambda d: (d / "empty").mkdir(), None, ["--images", lambda d: d / "empty"], ["--images", "no image files"]),
    "two inputs": (None, None, ["--raw", "x.raw", "--frame-size", "2x2", "--images", "y"], ["give one input"]),
}
# what a case says in a build without OpenCV (the tests ask the binary, features())
NO_OPENCV_WORDS = {"image /dev/zero": ["image /dev/zero", "no OpenCV"]}
if not torch.cuda.is_available():
    ERRORS["cuda package without cuda"] = (lambda d: _edit_manifest(d, lambda m: m.update(device="cuda", compute_capability="9.0")),
                                           None, [], ["CUDA is not available"])
LOOPS = ("--raw", "--images", "--video")


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_are_one_line_and_exit_1(runner, exported, tmp_path, case):
    edit, csv_text, extra, words = ERRORS[case]
    if case in NO_OPENCV_WORDS and not has_opencv(runner):
        words = NO_OPENCV_WORDS[case]
    d = tmp_path / "pkg"
    shutil.copytree(exported, d)
    if edit:
        edit(d)
    pts = tmp_path / "pts.csv"
    pts.write_text(csv_text or DEFAULT_PTS)
    extra = [e(d) if callable(e) else e for e in extra]
    image = [] if any(a in LOOPS for a in extra) else ["--image", d / "reference.safetensors"]
    proc = run(runner, "--manifest", d / "manifest.json", *image, "--points", pts, *extra, timeout=60)
    assert proc.returncode == 1, f"{case}: exit {proc.returncode}\n{proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("depthpack_run: error: "), proc.stderr
    for w in words:
        assert w in lines[0], f"{case}: {w!r} not in {lines[0]!r}"
    assert proc.stdout == ""  # no partial output


OUT_TARGETS = {  # name: (what --out names, given the copy d of the export and the points file, expected words)
    "the manifest": (lambda d, pts: d / "manifest.json", ["export folder"]),
    "the weights": (lambda d, pts: d / "weights.safetensors", ["export folder"]),
    "a package": (lambda d, pts: d / "depthpack_k8.pt2", ["export folder"]),
    "a new file in the export folder": (lambda d, pts: d / "depths.csv", ["export folder"]),
    "the export folder by another path": (lambda d, pts: d / "." / ".." / d.name / "reference_points.csv", ["export folder"]),
    "the points": (lambda d, pts: pts, ["is the input", "pts.csv"]),
    "the image": (lambda d, pts: pts.parent / "img.safetensors", ["is the input", "img.safetensors"]),
    "a link to the points": (lambda d, pts: (pts.parent / "link.csv").symlink_to(pts) or pts.parent / "link.csv", ["is the input"]),
    "a hard link to the points": (lambda d, pts: os.link(pts, pts.parent / "hard.csv") or pts.parent / "hard.csv", ["is the input"]),
}


@pytest.mark.parametrize("target", sorted(OUT_TARGETS))
def test_out_never_writes_over_an_input_or_the_export(runner, exported, tmp_path, target):
    """--out naming the manifest (the data loss of the issue: CSV over the manifest, exit 0), another
    file of the export folder, or an input by any path or link: refused before anything runs, every
    file unchanged."""
    d = tmp_path / "pkg"
    shutil.copytree(exported, d)
    pts = tmp_path / "pts.csv"
    pts.write_text(DEFAULT_PTS)
    shutil.copy(d / "reference.safetensors", tmp_path / "img.safetensors")
    fn, words = OUT_TARGETS[target]
    out = fn(d, pts)
    before = {f: f.read_bytes() for f in [*d.iterdir(), pts, tmp_path / "img.safetensors"]}
    proc = run(runner, "--manifest", d / "manifest.json", "--image", tmp_path / "img.safetensors", "--points", pts, "--out", out)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(err) == 1 and err[0].startswith("depthpack_run: error: --out "), proc.stderr
    assert all(w in err[0] for w in words), err[0]
    assert {f: f.read_bytes() for f in before} == before and sorted(d.iterdir()) == sorted(f for f in before if f.parent == d)
    ok = run(runner, "--manifest", d / "manifest.json", "--image", tmp_path / "img.safetensors", "--points", pts,
             "--out", tmp_path / "depths.csv")  # the control: a file elsewhere
    assert ok.returncode == 0 and read_out(tmp_path / "depths.csv").shape == (10, 3), ok.stderr


@pytest.mark.parametrize("how", ["one path", "another path", "a symbolic link", "a hard link"])
def test_out_and_map_never_name_one_file(runner, exported, tmp_path, how):
    """--out X --map X wrote the depths, then the map over them, exit 0: two outputs that are one file (by
    any path or link) are refused before anything runs, one line, exit 1, the file as it was."""
    pts = write_csv(tmp_path / "pts.csv", [[1.5, 2.5]])
    out = tmp_path / "both.csv"
    out.write_text("mine\n")
    other = {"one path": out, "another path": tmp_path / "." / "both.csv",
             "a symbolic link": tmp_path / "link.csv", "a hard link": tmp_path / "hard.csv"}[how]
    if how == "a symbolic link":
        other.symlink_to(out)
    elif how == "a hard link":
        os.link(out, other)
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", exported / "reference.safetensors",
               "--points", pts, "--out", out, "--map", other)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(err) == 1 and "are the same file" in err[0], proc.stderr
    assert out.read_text() == "mine\n" and proc.stdout == ""


def test_weights_that_fit_are_accepted_after_a_rewrite(runner, exported, tmp_path):
    """The control of the weights cases: the same tensors written anew (another file, its sha256 in the
    manifest) pass --check; the same file with one constant transposed was answered by the old runner."""
    d = tmp_path / "pkg"
    shutil.copytree(exported, d)
    _rewrite_weights(d, lambda w: None)
    proc = run(runner, "--manifest", d / "manifest.json", "--check", d / "reference.safetensors")
    assert proc.returncode == 0 and ": OK" in proc.stderr, proc.stderr


def test_package_metadata_that_agrees_is_accepted(runner, exported, tmp_path):
    """The control of the metadata cases: the same rewritten packages, mapped right, check OK."""
    d = tmp_path / "pkg"
    shutil.copytree(exported, d)
    _with_package_metadata(d)
    proc = run(runner, "--manifest", d / "manifest.json", "--check", d / "reference.safetensors")
    assert proc.returncode == 0 and ": OK" in proc.stderr, proc.stderr


def test_undecodable_image_file(runner, exported, tmp_path):
    """Not an image at all, and a complete PNG whose pixel data is corrupt: one line each."""
    import zlib

    (tmp_path / "bad.png").write_bytes(b"just some text, not an image")
    idat = zlib.compress(b"\0" * 10)[:-3] + b"\xff\xff\xff"  # a broken zlib stream
    chunk = lambda kind, data: len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")  # noqa: E731
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", bytes([0, 0, 0, 4, 0, 0, 0, 2, 8, 2, 0, 0, 0]))
                                          + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    (tmp_path / "pts.csv").write_text("1,1\n")
    for name in ("bad.png", "broken.png"):
        proc = run(runner, "--manifest", exported / "manifest.json", "--image", tmp_path / name, "--points", tmp_path / "pts.csv")
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert ("cannot be decoded" in proc.stderr and name in proc.stderr) or "no OpenCV" in proc.stderr, proc.stderr


@pytest.mark.parametrize("fmt", ["jpg", "png"])
def test_truncated_image_file_is_refused(runner, exported, tmp_path, fmt):
    """A JPEG or PNG cut to 60%: the runner refuses it, naming the file (OpenCV alone would hand
    back a partly grey image for the JPEG, and depths with exit code 0)."""
    if not has_opencv(runner):
        pytest.skip("runner built without OpenCV")
    import cv2

    bgr = noise_frames(1, 80, 96)[0]
    ok, data = cv2.imencode("." + fmt, bgr)
    (tmp_path / f"full.{fmt}").write_bytes(data.tobytes())
    (tmp_path / f"cut.{fmt}").write_bytes(data.tobytes()[: int(len(data) * 0.6)])
    if fmt == "jpg":
        assert cv2.imread(str(tmp_path / "cut.jpg")) is not None  # what the check is for
        (tmp_path / "padded.jpg").write_bytes(data.tobytes() + b"\0" * 16)  # zero padding after EOI is fine
    (tmp_path / "pts.csv").write_text("x,y\n1,2\n50,40\n")
    for name in [f"full.{fmt}"] + (["padded.jpg"] if fmt == "jpg" else []):
        proc = run(runner, "--manifest", exported / "manifest.json", "--image", tmp_path / name, "--points", tmp_path / "pts.csv")
        assert proc.returncode == 0, proc.stderr
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", tmp_path / f"cut.{fmt}", "--points", tmp_path / "pts.csv")
    assert proc.returncode == 1 and proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthpack_run: error: image ") and f"cut.{fmt}" in err[0], proc.stderr
    assert ("EOI" if fmt == "jpg" else "IEND") in err[0] and "truncated" in err[0]


# ---- frame loops ------------------------------------------------------------------------------------------
def test_raw_frames_equal_python(runner, exported, python_depth, tmp_path):
    """--raw: 5 bgr8 frames of 96x80, 20 points (chunks 16 + 4): every frame's depths are Python's
    (its preprocessing and chunking); the latency report holds median <= p90, with and without the
    read; after the first frame the runner allocates no buffer."""
    size = manifest_of(exported)["image_size"]
    frames = noise_frames(5, 80, 96)
    frames.tofile(tmp_path / "f.raw")
    pts = frame_points(80, 96, 20)
    proc = run(runner, "--manifest", exported / "manifest.json", "--raw", tmp_path / "f.raw", "--frame-size", "96x80",
               "--points", write_csv(tmp_path / "p.csv", pts), "--out", tmp_path / "d.csv")
    assert proc.returncode == 0, proc.stderr
    out = read_frames_out(tmp_path / "d.csv")
    assert out.shape == (5 * 20, 4)
    for i, bgr in enumerate(frames):
        rows = out[out[:, 0] == i]
        np.testing.assert_array_equal(rows[:, 1:3], pts)
        assert np.abs(rows[:, 3] - frame_depth(python_depth, bgr, pts, size)).max() < 1e-5
    rep = loop_report(proc.stderr)
    assert rep["frames"] == "5" and rep["skipped"] == "0"
    for what in ("predict", "read_predict"):
        assert 0 < float(rep[f"{what}_median_ms"]) <= float(rep[f"{what}_p90_ms"])
    assert rep["buffers_first"] == rep["buffers_end"], rep  # steady state: no new buffer per frame


def test_raw_stream_cut_inside_a_frame(runner, exported, tmp_path):
    """A stream that ends inside its third frame: two frames answered, the third named, exit 1."""
    noise_frames(3, 80, 96).tofile(tmp_path / "f.raw")
    data = (tmp_path / "f.raw").read_bytes()
    (tmp_path / "f.raw").write_bytes(data[: len(data) - 1000])
    (tmp_path / "p.csv").write_text("x,y\n3,4\n")
    proc = run(runner, "--manifest", exported / "manifest.json", "--raw", tmp_path / "f.raw", "--frame-size", "96x80",
               "--points", tmp_path / "p.csv", "--out", tmp_path / "d.csv")
    assert proc.returncode == 1
    assert sorted(set(read_frames_out(tmp_path / "d.csv")[:, 0])) == [0, 1]
    err = proc.stderr.strip().splitlines()
    assert "skipped frame 2" in err[0] and "ends inside this frame" in err[0], proc.stderr
    assert err[-1] == "depthpack_run: error: 1 of 3 frames skipped (named above)"


def test_raw_frames_from_stdin(runner, exported, tmp_path):
    noise_frames(2, 80, 96).tofile(tmp_path / "f.raw")
    (tmp_path / "p.csv").write_text("x,y\n3,4\n90,70\n")
    args = ["--manifest", exported / "manifest.json", "--frame-size", "96x80", "--points", tmp_path / "p.csv"]
    from_file = run(runner, *args, "--raw", tmp_path / "f.raw")
    with open(tmp_path / "f.raw", "rb") as f:
        piped = subprocess.run([str(runner), *map(str, args), "--raw", "-"], stdin=f, capture_output=True, text=True, timeout=60)
    assert from_file.returncode == piped.returncode == 0, piped.stderr
    assert piped.stdout == from_file.stdout and piped.stdout.count("\n") == 1 + 2 * 2


def test_images_folder_skips_corrupt_frames(runner, exported, python_depth, tmp_path):
    """A folder of 3 good PNGs (two sizes), a truncated JPEG and a file that is no image: the good
    ones are answered in name order with Python's depths, the two bad ones named on stderr and
    skipped, the loop goes on, exit code 1."""
    if not has_opencv(runner):
        pytest.skip("runner built without OpenCV")
    import cv2

    size = manifest_of(exported)["image_size"]
    d = tmp_path / "frames"
    d.mkdir()
    good = {"a.png": noise_frames(1, 80, 96, 1)[0], "c.png": noise_frames(1, 80, 96, 2)[0], "e.png": noise_frames(1, 72, 90, 3)[0]}
    for name, bgr in good.items():
        cv2.imwrite(str(d / name), bgr)
    jpg = cv2.imencode(".jpg", noise_frames(1, 80, 96, 4)[0])[1].tobytes()
    (d / "b.jpg").write_bytes(jpg[: int(len(jpg) * 0.6)])
    (d / "d.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    (d / "notes.txt").write_text("not a frame: ignored")
    pts = frame_points(72, 90, 6)
    proc = run(runner, "--manifest", exported / "manifest.json", "--images", d, "--points", write_csv(tmp_path / "p.csv", pts),
               "--out", tmp_path / "o.csv")
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()
    assert [ln.split(" (")[0] for ln in err if "skipped frame" in ln] == ["depthpack_run: skipped frame 1", "depthpack_run: skipped frame 3"]
    assert "b.jpg" in err[0] and "truncated" in err[0] and "d.png" in err[1], proc.stderr
    assert err[-1] == "depthpack_run: error: 2 of 5 frames skipped (named above)"
    out = read_frames_out(tmp_path / "o.csv")
    assert sorted(set(out[:, 0])) == [0, 2, 4]
    for i, name in ((0, "a.png"), (2, "c.png"), (4, "e.png")):
        assert np.abs(out[out[:, 0] == i, 3] - frame_depth(python_depth, good[name], pts, size)).max() < 1e-5
    rep = loop_report(proc.stderr)
    assert rep["frames"] == "3" and rep["skipped"] == "2"
    assert int(rep["buffers_end"]) > int(rep["buffers_first"])  # the counter counts: e.png's new size


def test_video_frames_equal_python(runner, exported, python_depth, tmp_path):
    """--video on an MJPG AVI written by opencv-python: Python's depths of the frames Python decodes;
    the same file cut to 60% is named as cut short, exit code 1."""
    import cv2

    if features(runner)["videoio"] != "1":
        pytest.skip("runner built without OpenCV videoio (apt-get install libopencv-videoio-dev)")
    writer = cv2.VideoWriter(str(tmp_path / "v.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10, (96, 80))
    if not writer.isOpened():
        pytest.skip("opencv-python cannot write MJPG here")
    for bgr in noise_frames(6, 80, 96, 7):
        writer.write(bgr)
    writer.release()
    cap, decoded = cv2.VideoCapture(str(tmp_path / "v.avi")), []
    while (f := cap.read())[0]:
        decoded.append(f[1])
    pts = frame_points(80, 96, 5)
    write_csv(tmp_path / "p.csv", pts)
    proc = run(runner, "--manifest", exported / "manifest.json", "--video", tmp_path / "v.avi", "--points", tmp_path / "p.csv",
               "--out", tmp_path / "o.csv")
    assert proc.returncode == 0, proc.stderr
    out = read_frames_out(tmp_path / "o.csv")
    assert sorted(set(out[:, 0])) == list(range(len(decoded))) == list(range(6))
    size = manifest_of(exported)["image_size"]
    for i, bgr in enumerate(decoded):  # two JPEG decoders: the manifest's tolerance
        assert_close(out[out[:, 0] == i, 3], frame_depth(python_depth, bgr, pts, size), *tolerance(exported))
    data = (tmp_path / "v.avi").read_bytes()
    (tmp_path / "cut.avi").write_bytes(data[: int(len(data) * 0.6)])
    proc = run(runner, "--manifest", exported / "manifest.json", "--video", tmp_path / "cut.avi", "--points", tmp_path / "p.csv",
               "--out", tmp_path / "o.csv")
    assert proc.returncode == 1
    assert "header says 6 frames" in proc.stderr and proc.stderr.strip().endswith("frames skipped (named above)"), proc.stderr


# ---- frame packages: uint8 frames in, preprocessing inside the package ------------------------------------
def test_frame_packages_check_reference(runner, frames_exported):
    m = manifest_of(frames_exported)
    assert m["frame"] == {"size": list(FRAME), "color": "bgr"} and m["buckets"][0]["inputs"][0]["name"] == "frames"
    proc = run(runner, "--manifest", frames_exported / "manifest.json", "--check", frames_exported / "reference.safetensors")
    assert proc.returncode == 0 and ": OK" in proc.stderr, proc.stderr


def test_frame_packages_raw_frames_equal_python(runner, frames_exported, python_frame_depth, tmp_path):
    """Raw frames straight into the packages: the package's own function, eager, within 1e-5 m;
    20 points: chunks of 16 + 4; no buffer after the first frame."""
    frames = noise_frames(4, *FRAME, seed=3)
    frames.tofile(tmp_path / "f.raw")
    pts = frame_points(*FRAME, 20)
    proc = run(runner, "--manifest", frames_exported / "manifest.json", "--raw", tmp_path / "f.raw",
               "--frame-size", f"{FRAME[1]}x{FRAME[0]}", "--points", write_csv(tmp_path / "p.csv", pts), "--out", tmp_path / "o.csv")
    assert proc.returncode == 0, proc.stderr
    out = read_frames_out(tmp_path / "o.csv")
    want = python_frame_depth(torch.from_numpy(frames), torch.from_numpy(pts.astype(np.float32))[None].repeat(4, 1, 1)).numpy()
    for i in range(4):
        assert np.abs(out[out[:, 0] == i, 3] - want[i]).max() < 1e-5
    rep = loop_report(proc.stderr)
    assert rep["frames"] == "4" and rep["buffers_first"] == rep["buffers_end"], rep


def test_frame_packages_image_file(runner, frames_exported, tmp_path):
    """reference.png is a frame of the packages' size: decoded, handed over as it is; row 0 of the
    reference's depth (computed by the exporter from the same PNG)."""
    if not has_opencv(runner):
        pytest.skip("runner built without OpenCV")
    proc = run(runner, "--manifest", frames_exported / "manifest.json", "--image", frames_exported / "reference.png",
               "--points", frames_exported / "reference_points.csv", "--out", tmp_path / "d.csv")
    assert proc.returncode == 0, proc.stderr
    ref = load_file(str(frames_exported / "reference.safetensors"))
    assert_close(read_out(tmp_path / "d.csv")[:, 2], ref["depth"][0].numpy(), *tolerance(frames_exported))


def test_frame_packages_refuse_another_frame_size(runner, frames_exported, tmp_path):
    noise_frames(1, 48, 64).tofile(tmp_path / "f.raw")
    (tmp_path / "p.csv").write_text("x,y\n3,4\n")
    proc = run(runner, "--manifest", frames_exported / "manifest.json", "--raw", tmp_path / "f.raw", "--frame-size", "64x48",
               "--points", tmp_path / "p.csv")
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(err) == 1 and proc.stdout == "", proc.stderr
    assert "the frame is 64x48 but the packages take 96x80 frames" in err[0]


@pytest.mark.parametrize("packages", ["images", "frames"])
def test_robot_loop_rgb_frames(runner, example, exported, frames_exported, tmp_path, packages):
    """The same frames handed over as rgb8 (Order::RGB) give the bgr8 depths, for packages that take
    images (the runner converts) and frames in BGR order (the runner swaps the channels)."""
    d = exported if packages == "images" else frames_exported
    frames = noise_frames(2, *FRAME, seed=9)
    frames.tofile(tmp_path / "bgr.raw")
    np.ascontiguousarray(frames[..., ::-1]).tofile(tmp_path / "rgb.raw")
    size = f"{FRAME[1]}x{FRAME[0]}"
    bgr, rgb = run(example, d / "manifest.json", tmp_path / "bgr.raw", size), run(example, d / "manifest.json", tmp_path / "rgb.raw", size, "rgb")
    assert bgr.returncode == rgb.returncode == 0, bgr.stderr + rgb.stderr
    assert bgr.stdout == rgb.stdout and len(bgr.stdout.splitlines()) == 2
    swapped = run(example, d / "manifest.json", tmp_path / "rgb.raw", size)  # the channel order matters
    assert swapped.stdout != bgr.stdout


def test_robot_loop_example_gives_the_clis_depths(runner, example, exported, tmp_path):
    """examples/robot_loop.cpp links the library and calls Runner::predict per raw frame: its depths
    at the centre and quarter points are the CLI's."""
    noise_frames(3, 80, 96).tofile(tmp_path / "f.raw")
    proc = run(example, exported / "manifest.json", tmp_path / "f.raw", "96x80")
    assert proc.returncode == 0, proc.stderr
    got = np.array([[float(v) for v in ln.split(":")[1].split()] for ln in proc.stdout.splitlines()])
    (tmp_path / "p.csv").write_text("x,y\n48,40\n24,20\n72,20\n24,60\n72,60\n")
    cli = run(runner, "--manifest", exported / "manifest.json", "--raw", tmp_path / "f.raw", "--frame-size", "96x80",
              "--points", tmp_path / "p.csv", "--out", tmp_path / "o.csv")
    assert cli.returncode == 0, cli.stderr
    np.testing.assert_allclose(got, read_frames_out(tmp_path / "o.csv")[:, 3].reshape(3, 5), atol=1e-6)
    bad = run(example, tmp_path / "missing.json", tmp_path / "f.raw", "96x80")
    assert bad.returncode == 1 and bad.stderr.startswith("robot_loop: manifest ") and len(bad.stderr.splitlines()) == 1


def test_robot_loop_reports_a_frame_cut_short(runner, example, exported, tmp_path):
    """A stream that ends inside its third frame: robot_loop answers the two whole frames, then names
    the third on one line and exits 1, as depthpack_run --raw does (it used to drop it with exit 0)."""
    noise_frames(3, 80, 96).tofile(tmp_path / "f.raw")
    data = (tmp_path / "f.raw").read_bytes()
    (tmp_path / "cut.raw").write_bytes(data[: len(data) - 1000])
    proc = run(example, exported / "manifest.json", tmp_path / "cut.raw", "96x80")
    assert proc.returncode == 1, proc.stderr
    assert [ln.split(":")[0] for ln in proc.stdout.splitlines()] == ["frame 0", "frame 1"]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("robot_loop: ") and "cut.raw frame 2: " in err[0], proc.stderr
    assert f"only {80 * 96 * 3 - 1000} of {80 * 96 * 3} bytes" in err[0] and "ends inside this frame" in err[0]
    with open(tmp_path / "cut.raw", "rb") as f:  # the same from a pipe
        piped = subprocess.run([str(example), str(exported / "manifest.json"), "-", "96x80"], stdin=f, capture_output=True,
                               text=True, timeout=60)
    assert piped.returncode == 1 and piped.stdout == proc.stdout and "ends inside this frame" in piped.stderr


def test_version_says_what_the_build_has(runner):
    """The tests' source of truth on the build: the binary's own --version, one line."""
    f = features(runner)
    assert set(f) == {"libtorch", "cuda", "opencv", "videoio"} and f["libtorch"] == torch.__version__.split("+")[0]
    assert f["opencv"] in ("0", "1") and (f["videoio"] == "0" or f["opencv"] == "1")


def test_build_without_opencv(runner, exported, tmp_path):
    """-DDEPTHPACK_OPENCV=OFF (the GPU machine has no OpenCV C++ packages): it builds, --raw frames
    give the OpenCV build's depths, image files and videos are refused with one line."""
    nocv = build_runner(Path(os.environ.get("DEPTHPACK_BUILD_NOCV") or tmp_path / "nocv"), "-DDEPTHPACK_OPENCV=OFF",
                        target="depthpack_run")
    noise_frames(2, 80, 96).tofile(tmp_path / "f.raw")
    (tmp_path / "p.csv").write_text("x,y\n3,4\n90,70\n")
    args = ["--manifest", exported / "manifest.json", "--raw", tmp_path / "f.raw", "--frame-size", "96x80", "--points", tmp_path / "p.csv"]
    a, b = run(nocv, *args), run(runner, *args)
    assert a.returncode == b.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    for flag, word in (("--image", "no OpenCV"), ("--video", "no OpenCV videoio"), ("--images", "no OpenCV")):
        proc = run(nocv, "--manifest", exported / "manifest.json", flag, exported / "reference.png", "--points", tmp_path / "p.csv")
        assert proc.returncode == 1 and word in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert features(nocv)["opencv"] == "0"  # what the error cases ask to pick their words
    proc = run(nocv, "--manifest", exported / "manifest.json", "--image", "/dev/zero", "--points", tmp_path / "p.csv")
    assert proc.returncode == 1 and all(w in proc.stderr for w in NO_OPENCV_WORDS["image /dev/zero"]), proc.stderr


# ---- the focal input: packages of a model with canonical_focal ----------------------------------------------
FOCAL_MODEL = "canonical_focal=48.0,focal_default=40.0"  # pixels of the 64x64 model image


@pytest.fixture(scope="module")
def focal_exported(runner, tmp_path_factory) -> dict[str, Path]:
    """{"images": image packages, "frames": frame packages} of the tiny preset with a focal input."""
    outs = {"images": export_dir(tmp_path_factory, "focal_images"), "frames": export_dir(tmp_path_factory, "focal_frames")}
    procs = [start_kept_export(outs["images"], model=FOCAL_MODEL), start_kept_export(outs["frames"], frame=True, model=FOCAL_MODEL)]
    for proc, out in zip(procs, outs.values()):
        finish_export(proc, out)
    return outs


@pytest.fixture(scope="module")
def focal_model():
    from depthpack.deploy.build import load_for_export

    return load_for_export(None, "tiny", 0, {k: float(v) for k, v in (x.split("=") for x in FOCAL_MODEL.split(","))})[0]


@pytest.mark.parametrize("kind", ["images", "frames"])
def test_focal_packages_check_the_references_focal(runner, focal_exported, tmp_path, kind):
    """--check feeds the reference's focal (1.25x the default): it passes, and the same reference
    without its focal (the runner then feeds the manifest's default) is a mismatch."""
    from safetensors.torch import save_file

    d = focal_exported[kind]
    assert [t["name"] for t in manifest_of(d)["buckets"][0]["inputs"]] == [kind, "points", "focal"]
    proc = run(runner, "--manifest", d / "manifest.json", "--check", d / "reference.safetensors")
    assert proc.returncode == 0 and ": OK" in proc.stderr, proc.stderr
    ref = load_file(str(d / "reference.safetensors"))
    save_file({k: v for k, v in ref.items() if k != "focal"}, str(tmp_path / "nofocal.safetensors"))
    proc = run(runner, "--manifest", d / "manifest.json", "--check", tmp_path / "nofocal.safetensors")
    assert proc.returncode == 1 and "MISMATCH" in proc.stderr, proc.stderr


def test_focal_flag_on_raw_frames_equals_python(runner, focal_exported, focal_model, tmp_path):
    """--focal F in the frame's pixels into frame packages: the package's function with F, eager; no
    --focal: the manifest's default, which is the model's default."""
    from depthpack.core.packing import run_chunked
    from depthpack.deploy.package import PackedForward

    d = focal_exported["frames"]
    frame = manifest_of(d)["frame"]
    frames = noise_frames(2, *FRAME, seed=5)
    frames.tofile(tmp_path / "f.raw")
    pts = frame_points(*FRAME, 20)
    csv = write_csv(tmp_path / "p.csv", pts)
    points = torch.from_numpy(pts.astype(np.float32))[None]
    depths = {}
    for f in (None, 30.0, 75.5):
        proc = run(runner, "--manifest", d / "manifest.json", "--raw", tmp_path / "f.raw", "--frame-size",
                   f"{FRAME[1]}x{FRAME[0]}", "--points", csv, "--out", tmp_path / "o.csv", *(["--focal", f] if f else []))
        assert proc.returncode == 0, proc.stderr
        out = read_frames_out(tmp_path / "o.csv")
        for i in range(2):
            with torch.no_grad():
                fn = lambda x, p, k, *focal: PackedForward(focal_model, k, frame)(x, p, *focal)[0]  # noqa: E731
                want = run_chunked(fn, torch.from_numpy(frames[i:i + 1]), points, BUCKETS,
                                   *([torch.tensor([f])] if f else []))[0].numpy()
            assert np.abs(out[out[:, 0] == i, 3] - want).max() < 1e-4, f
        depths[f] = out[:, 3]
    np.testing.assert_allclose(depths[75.5], depths[30.0] * 75.5 / 30.0, rtol=1e-4)  # depth follows the lens


def test_focal_flag_on_an_image_file_is_scaled_like_the_points(runner, focal_exported, focal_model, tmp_path):
    """An image file (1.5x / 1.25x the model's size) into image packages: --focal F in the file's
    pixels reaches the package as F * sqrt(W/w * H/h), as core.preprocess.scale_focal says."""
    from depthpack.core.packing import run_chunked
    from depthpack.core.preprocess import load_image, scale_focal, scale_points

    d = focal_exported["images"]
    if not has_opencv(runner):
        pytest.skip("this build has no OpenCV")
    proc = run(runner, "--manifest", d / "manifest.json", "--image", d / "reference.png", "--points",
               d / "reference_points.csv", "--focal", "70", "--out", tmp_path / "o.csv")
    assert proc.returncode == 0, proc.stderr
    got = read_out(tmp_path / "o.csv")
    image, size = load_image(d / "reference.png", (64, 64))
    xy = scale_points(torch.from_numpy(got[:, :2].astype(np.float32)), size, (64, 64))[None]
    with torch.no_grad():
        want = run_chunked(focal_model.packed_core, image[None], xy, BUCKETS,
                           scale_focal(torch.tensor([70.0]), size, (64, 64)))
    assert np.abs(got[:, 2] - want[0].numpy()).max() < 1e-4


def test_focal_flag_is_ignored_with_one_warning_by_packages_without_focal(runner, exported, tmp_path):
    """Like the Predictor: a robot passes its camera's focal to every model; one without a focal input
    answers as without it, and the command line says so once."""
    pts = write_csv(tmp_path / "p.csv", frame_points(64, 64, 10))
    args = ["--manifest", exported / "manifest.json", "--image", exported / "reference.safetensors", "--points", pts]
    plain, given = run(runner, *args), run(runner, *args, "--focal", "500")
    assert plain.returncode == 0 and given.returncode == 0, given.stderr
    assert given.stdout == plain.stdout
    warnings = [ln for ln in given.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "--focal ignored" in warnings[0], given.stderr


# ---- the contract: deploy_cpp/manifest.h lists what depthpack/deploy/contract.py lists --------------------
def _marked(header: str, name: str) -> list[str]:
    import re

    m = re.search(rf"// contract: {name}\n[^\n]*?=\s*(\{{.*?\}}|\"[^\"]*\");", header, re.S)
    assert m, f"no '// contract: {name}' declaration in deploy_cpp/manifest.h"
    return re.findall(r'"([^"]*)"', m[1])


def test_manifest_h_lists_the_contracts_keys():
    from depthpack.deploy import contract

    header = (ROOT / "deploy_cpp" / "manifest.h").read_text()
    assert _marked(header, "FORMAT") == [contract.FORMAT]
    assert _marked(header, "FORMAT_SHARED") == [contract.FORMAT_SHARED]
    assert _marked(header, "FORMAT_NO_MAP") == [contract.FORMAT_NO_MAP]
    assert tuple(_marked(header, "REQUIRED_KEYS")) == contract.REQUIRED_KEYS
    assert tuple(_marked(header, "BUCKET_KEYS")) == contract.BUCKET_KEYS
    assert tuple(_marked(header, "MAP_PACKAGE_KEYS")) == contract.MAP_PACKAGE_KEYS
    assert _marked(header, "MAP_BUCKET") == [contract.MAP_BUCKET]
    assert f"std::array<const char*, {len(contract.REQUIRED_KEYS)}> kRequiredKeys" in header


def test_runner_refuses_what_pythons_read_manifest_refuses(runner, exported, tmp_path):
    """Each required key, removed: Python's read_manifest and the runner both refuse, naming it."""
    from depthpack.deploy.contract import REQUIRED_KEYS, ManifestError, read_manifest

    d = tmp_path / "pkg"
    shutil.copytree(exported, d)
    good = (d / "manifest.json").read_text()
    for key in REQUIRED_KEYS[1:]:  # without "format" it is not a manifest at all (tested above)
        _edit_manifest(d, lambda m: m.pop(key))
        with pytest.raises(ManifestError, match=key):
            read_manifest(d / "manifest.json")
        proc = run(runner, "--manifest", d / "manifest.json", "--check", d / "reference.safetensors")
        assert proc.returncode == 1 and f'missing key "{key}"' in proc.stderr, proc.stderr
        (d / "manifest.json").write_text(good)


# ---- bad input, property-based: the CSV and image readers ---------------------------------------------
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_GOOD = st.tuples(st.floats(0, 63.999, allow_nan=False), st.floats(0, 63.999, allow_nan=False)).map(
    lambda p: ("good", f"{p[0]!r},{p[1]!r}", p))
_BAD = st.one_of(
    st.tuples(st.floats(64, 1e9), st.floats(0, 63)).map(lambda p: f"{p[0]!r},{p[1]!r}"),
    st.tuples(st.floats(0, 63), st.floats(-1e9, -1e-6)).map(lambda p: f"{p[0]!r},{p[1]!r}"),
    st.sampled_from(["nan,1", "1,inf", "-inf,2", "1;2", "1,2,3", "7", ",", "x,", "abc,def", "1,,2", "0x,1", "\x00,1"]),
    st.text(alphabet="0123456789.,-eE xy;abc", min_size=1, max_size=12).filter(lambda t: not _parses_ok(t)),
).map(lambda t: ("bad", t, None))


def _parses_ok(text: str) -> bool:
    """Whether a line is blank or two finite in-image numbers (what the runner must accept)."""
    if not text.strip() or text.strip() == "x,y":
        return True
    parts = text.split(",")
    if len(parts) != 2:
        return False
    try:
        x, y = float(parts[0]), float(parts[1])
    except ValueError:
        return False
    return 0 <= x < 64 and 0 <= y < 64


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(_GOOD, _GOOD, _GOOD, _BAD, st.just(("blank", "", None))), min_size=0, max_size=40))
def test_csv_reader_answers_or_fails_cleanly(runner, exported, python_depth, tmp_path, lines):
    """Random CSVs: all good lines -> the Python answer for exactly those points; any bad line -> exit 1
    with one line that names a line number. Never a crash, a hang or garbage."""
    csv = tmp_path / "fuzz.csv"
    csv.write_text("x,y\n" + "\n".join(t for _, t, _ in lines) + "\n")
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", exported / "reference.safetensors",
               "--points", csv, timeout=120)
    assert proc.returncode in (0, 1), f"crash: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    bad = [i for i, (kind, _, _) in enumerate(lines) if kind == "bad"]
    if proc.returncode == 1:
        err = proc.stderr.strip().splitlines()
        assert bad, f"valid input refused: {proc.stderr}"
        assert len(err) == 1 and err[0].startswith("depthpack_run: error: ") and "line" in err[0], proc.stderr
        assert proc.stdout == ""
        return
    assert not bad, f"bad lines {[lines[i][1] for i in bad]} accepted"
    good = [p for kind, _, p in lines if kind == "good"]
    out = np.array([[float(v) for v in ln.split(",")] for ln in proc.stdout.splitlines()[1:]]).reshape(-1, 3)
    assert len(out) == len(good)
    if good:
        images = load_file(str(exported / "reference.safetensors"))["images"][:1]
        want = python_depth(images, torch.tensor(good, dtype=torch.float32)[None])[0].numpy()
        assert_close(out[:, 2], want, *tolerance(exported))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(min_size=0, max_size=300),
                      st.integers(8, 200).map(lambda n: b"\x89PNG\r\n\x1a\n" + bytes(range(256))[:n]),
                      st.just(b"")))
def test_image_reader_fails_cleanly_on_garbage(runner, exported, tmp_path, data):
    """Random bytes, truncated PNGs and empty files as --image: one clear line and exit 1."""
    (tmp_path / "img.png").write_bytes(data)
    (tmp_path / "pts.csv").write_text("1,2\n")
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", tmp_path / "img.png",
               "--points", tmp_path / "pts.csv", timeout=120)
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthpack_run: error: ") and "image" in err[0], proc.stderr


# ---- CUDA (the H200 through the device tool) ----------------------------------------------------------
@pytest.fixture(scope="module")
def cuda_exported(runner, tmp_path_factory) -> Path:
    """The tiny preset exported for CUDA."""
    out = tmp_path_factory.mktemp("cuda") / "tiny_cuda"
    return finish_export(start_export(out, device="cuda"), out)


@pytest.mark.gpu
def test_cuda_graph_equals_no_graph_and_reference(runner, cuda_exported, tmp_path):
    d = cuda_exported
    ref = d / "reference.safetensors"
    outs = {}
    for flag in ([], ["--no-graph"]):
        proc = run(runner, "--manifest", d / "manifest.json", "--check", ref, "--image", ref,
                   "--points", write_csv(tmp_path / "p.csv", load_file(str(ref))["points"][0].numpy()),
                   "--out", tmp_path / "o.csv", "--bench", "50", *flag)
        assert proc.returncode == 0 and ": OK" in proc.stderr, proc.stderr
        assert f"graph={0 if flag else 1}" in proc.stderr
        outs[bool(flag)] = read_out(tmp_path / "o.csv")
    np.testing.assert_array_equal(outs[True], outs[False])  # the graph replays the very same kernels
    # the one-way map on CUDA: the map-only package (captured) and two point sets give one map
    maps = [_cpp_map(runner, d, ref, tmp_path, p) for p in (None, np.full((3, 2), 5.0, np.float32),
                                                            np.full((12, 2), 40.0, np.float32))]
    for m in maps[1:]:
        assert_close(m.ravel(), maps[0].ravel(), *tolerance(d))


@pytest.mark.gpu
def test_cuda_raw_frames(runner, example, cuda_exported, python_depth, tmp_path):
    """Raw frames on CUDA: preprocessing on the device, graphs replayed; equal to --no-graph, to
    Python's depths within the manifest's tolerance, no buffer after the first frame; robot_loop agrees."""
    d = cuda_exported
    frames = noise_frames(20, 480, 640)
    frames.tofile(tmp_path / "f.raw")
    pts = frame_points(480, 640, 20)
    outs = {}
    for flag in ([], ["--no-graph"]):
        proc = run(runner, "--manifest", d / "manifest.json", "--raw", tmp_path / "f.raw", "--frame-size", "640x480",
                   "--points", write_csv(tmp_path / "p.csv", pts), "--out", tmp_path / "o.csv", *flag)
        assert proc.returncode == 0, proc.stderr
        rep = loop_report(proc.stderr)
        assert rep["device"].startswith("cuda") and rep["graph"] == ("0" if flag else "1")
        assert rep["buffers_first"] == rep["buffers_end"], rep
        outs[bool(flag)] = read_frames_out(tmp_path / "o.csv")
        print(proc.stderr.strip().splitlines()[-1])
    np.testing.assert_array_equal(outs[True], outs[False])
    size = manifest_of(d)["image_size"]
    for i in (0, 19):
        assert_close(outs[False][outs[False][:, 0] == i, 3], frame_depth(python_depth, frames[i], pts, size), *tolerance(d))
    proc = run(example, d / "manifest.json", tmp_path / "f.raw", "640x480")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 20, proc.stderr


@pytest.fixture(scope="module")
def cuda_frames_exported(runner, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cuda") / "tiny_cuda_frames"
    return finish_export(start_export(out, device="cuda", frame=True), out)


@pytest.mark.gpu
def test_cuda_frame_packages(runner, cuda_frames_exported, python_frame_depth, tmp_path):
    """Frame packages on CUDA: raw frames copied into the graphs' shared uint8 input; --check OK,
    graph equals --no-graph, Python's function within the manifest's tolerance, no new buffers."""
    d = cuda_frames_exported
    proc = run(runner, "--manifest", d / "manifest.json", "--check", d / "reference.safetensors")
    assert proc.returncode == 0 and ": OK" in proc.stderr, proc.stderr
    frames = noise_frames(10, *FRAME, seed=4)
    frames.tofile(tmp_path / "f.raw")
    pts = frame_points(*FRAME, 20)
    outs = {}
    for flag in ([], ["--no-graph"]):
        proc = run(runner, "--manifest", d / "manifest.json", "--raw", tmp_path / "f.raw", "--frame-size", f"{FRAME[1]}x{FRAME[0]}",
                   "--points", write_csv(tmp_path / "p.csv", pts), "--out", tmp_path / "o.csv", *flag)
        assert proc.returncode == 0, proc.stderr
        rep = loop_report(proc.stderr)
        assert rep["graph"] == ("0" if flag else "1") and rep["buffers_first"] == rep["buffers_end"], rep
        outs[bool(flag)] = read_frames_out(tmp_path / "o.csv")
        print(proc.stderr.strip().splitlines()[-1])
    np.testing.assert_array_equal(outs[True], outs[False])
    want = python_frame_depth(torch.from_numpy(frames), torch.from_numpy(pts.astype(np.float32))[None].repeat(10, 1, 1)).numpy()
    for i in (0, 9):
        assert_close(outs[False][outs[False][:, 0] == i, 3], want[i], *tolerance(d))


# ---- the header-only helpers (no libtorch: a few seconds) ---------------------------------------------
STATS_MAIN = r'''
#include "stats.h"
#include <cstdio>
#include <cstdlib>
#include <vector>
int main(int argc, char** argv) {  // X...: median and p90
  std::vector<double> v;
  for (int i = 1; i < argc; ++i) v.push_back(std::atof(argv[i]));
  std::printf("%.17g %.17g\n", depthpack::median(v), depthpack::percentile(v, 0.9));
}
'''


def test_latency_summaries_are_pythons(tmp_path):
    import statistics

    from depthpack.runtime.graphs import percentile

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "t.cpp").write_text(STATS_MAIN)
    subprocess.run([cxx, "-std=c++20", "-O1", f"-I{ROOT / 'deploy_cpp'}", str(tmp_path / "t.cpp"), "-o", str(tmp_path / "t")], check=True)
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 9, 10, 11, 19, 20, 21, 100):  # the latency summaries: Python's rule exactly
        v = [float(x) for x in rng.integers(0, 8, n)] if n % 2 else [float(x) for x in rng.uniform(0, 5, n)]  # ties, and not
        proc = subprocess.run([str(tmp_path / "t"), *map(repr, v)], capture_output=True, text=True, check=True)
        assert [float(x) for x in proc.stdout.split()] == [statistics.median(v), percentile(v, 0.9)], v


@pytest.mark.slow
def test_context_tokens_through_the_packages_the_cpp_runner_and_onnx(runner, tmp_path):
    """The glance layout with registers ([cls | registers | glance | patches]) goes everywhere the model goes:
    its packages pass the exporter's check against eager, the C++ runner's check against the reference, the
    Python runner equals the eager model on fresh points, and its ONNX equals eager too."""
    out = tmp_path / "glance"
    cmd = [sys.executable, "-m", "depthpack.export", "--preset", "tiny", "--out", str(out), "--buckets", "8",
           "--model", "context=glance,glance_grid=4,registers=2", "--onnx"]
    e = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert e.returncode == 0, e.stderr[-3000:]
    assert "onnxruntime vs eager max |diff|" in e.stderr and "self-check ok" in e.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert (m["model_config"]["context"], m["model_config"]["glance_grid"], m["model_config"]["registers"]) == \
        ("glance", [4, 4], 2)
    p = subprocess.run([str(runner), "--manifest", str(out / "manifest.json"), "--check",
                        str(out / "reference.safetensors")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "OK" in p.stderr, p.stderr[-2000:]
    from depthpack.deploy.build import load_for_export
    from depthpack.runtime.aoti import load_runners

    model, _ = load_for_export(preset="tiny", overrides={"context": "glance", "glance_grid": 4, "registers": 2})
    _, runners = load_runners(out / "manifest.json", "cpu")
    g = torch.Generator().manual_seed(11)
    for k, fn in runners.items():
        images, pts = torch.rand(1, 3, 64, 64, generator=g), torch.rand(1, k, 2, generator=g) * 63.9
        with torch.no_grad():
            torch.testing.assert_close(fn(images, pts)[0], model.packed_core(images, pts, k), atol=1e-4, rtol=1e-4)
