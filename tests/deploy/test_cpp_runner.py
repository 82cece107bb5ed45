"""The C++ runner (deploy_cpp/depthpack_run) against Python, on the CPU.

Builds the runner with CMake against the libtorch of the installed wheel (about a minute on 2 cores;
DEPTHPACK_RUN=/path/to/depthpack_run skips the build), exports the tiny preset with
export/export.py (buckets 8 and 16, so that every chunking case is cheap), and checks that:
  - `--check reference.safetensors` passes and the runner's depths equal Python's eager packed
    forward (chunked by the same rule) within the manifest's tolerance, for Q below, at and above
    the bucket sizes, including Q > the largest bucket (chunks);
  - an image file (reference.png, resized and with scaled points) gives Python's answer, when the
    runner was built with OpenCV;
  - every bad input is one line on stderr and exit code 1.
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


def build_runner(build_dir: Path) -> Path:
    """Configure and build deploy_cpp into build_dir; a failed build fails the tests with CMake's words."""
    if shutil.which("cmake") is None:
        pytest.fail("cmake is not installed (apt-get install cmake)")
    prefix = torch.utils.cmake_prefix_path
    for cmd in (["cmake", "-S", ROOT / "deploy_cpp", "-B", build_dir, f"-DCMAKE_PREFIX_PATH={prefix}"],
                ["cmake", "--build", build_dir, "-j", str(min(4, os.cpu_count() or 1))]):
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
        if proc.returncode:
            pytest.fail(f"{' '.join(map(str, cmd[:2]))} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return build_dir / "depthpack_run"


def start_export(out: Path, device: str = "cpu", cpp_runner: Path | None = None) -> subprocess.Popen:
    cmd = [sys.executable, ROOT / "export" / "export.py", "--preset", "tiny", "--out", out, "--device", device,
           "--buckets", ",".join(map(str, BUCKETS))] + (["--cpp-runner", cpp_runner] if cpp_runner else [])
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_export(proc: subprocess.Popen, out: Path) -> Path:
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"export failed:\n{err[-4000:]}"
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(runner binary, tiny CPU export folder): the export runs while the runner compiles.

    With a CUDA build of torch 2.11, loading any package from Python segfaults (depthpack.runtime.aoti), so
    there the runner is built first and the export's self-check runs on it."""
    out = tmp_path_factory.mktemp("export") / "tiny"
    def get_runner() -> Path:
        return Path(os.environ["DEPTHPACK_RUN"]) if os.environ.get("DEPTHPACK_RUN") else \
            build_runner(tmp_path_factory.mktemp("cpp") / "build")
    if torch.version.cuda and torch.__version__.startswith("2.11"):
        runner = get_runner()
        return runner, finish_export(start_export(out, cpp_runner=runner), out)
    export = start_export(out)
    try:
        runner = get_runner()
    finally:
        exported = finish_export(export, out)
    return runner, exported


@pytest.fixture(scope="module")
def runner(built) -> Path:
    return built[0]


@pytest.fixture(scope="module")
def exported(built) -> Path:
    return built[1]


@pytest.fixture(scope="module")
def python_depth():
    """Python's answer: the eager packed forward of the same seeded weights, chunked like the runner."""
    from depthpack.core.packing import run_chunked
    from depthpack.deploy.export import load_for_export

    model, _ = load_for_export(None, "tiny", 0)

    def depth(images: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return run_chunked(model.forward_packed, images, points, BUCKETS)
    return depth


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


def has_opencv(runner: Path, exported: Path) -> bool:
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", exported / "reference.png",
               "--points", exported / "reference_points.csv", "--out", os.devnull)
    return "no OpenCV" not in proc.stderr


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
    """reference.png is larger than the model: OpenCV decode + resize + point scaling, as preprocess.py."""
    if not has_opencv(runner, exported):
        pytest.skip("runner built without OpenCV (apt-get install libopencv-imgcodecs-dev libopencv-imgproc-dev)")
    from depthpack.core.preprocess import load_image, scale_points

    H, W = manifest_of(exported)["image_size"]
    image, orig = load_image(exported / "reference.png", (H, W))
    pts0 = np.loadtxt(exported / "reference_points.csv", delimiter=",", skiprows=1, dtype=np.float64)
    assert orig != (H, W)  # the resize path is exercised
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", exported / "reference.png",
               "--points", exported / "reference_points.csv", "--out", tmp_path / "depth.csv")
    assert proc.returncode == 0, proc.stderr
    out = read_out(tmp_path / "depth.csv")
    np.testing.assert_array_equal(out[:, :2], pts0)  # original coordinates, input order
    want = python_depth(image[None], scale_points(pts0, orig, (H, W))[None])[0].numpy()
    assert_close(out[:, 2], want, *tolerance(exported))


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
    assert {int(ln.split("bucket=")[1].split()[0]) for ln in lines} == set(BUCKETS)  # 16 + a chunk of 3 -> 8
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


ERRORS = {  # name: (edit of a copy of the export dir, points CSV text or None, extra args, expected words)
    "tampered package": (lambda d: _flip_byte(d / "depthpack_k16.pt2"), None, [], ["depthpack_k16.pt2", "sha256", "does not match"]),
    "missing package": (lambda d: (d / "depthpack_k16.pt2").unlink(), None, [], ["depthpack_k16.pt2", "no such file"]),
    "corrupt package": (_corrupt_with_sha, None, [], ["depthpack_k16.pt2", "cannot be loaded"]),
    "malformed manifest": (lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text()[:-40]), None, [], ["manifest", "invalid JSON"]),
    "manifest without buckets": (lambda d: _edit_manifest(d, lambda m: m.pop("buckets")), None, [], ['missing key "buckets"']),
    "manifest shapes": (lambda d: _edit_manifest(d, lambda m: m.update(image_size=[32, 64])), None, [], ["shape", "differs"]),
    "missing manifest": (lambda d: (d / "manifest.json").unlink(), None, [], ["manifest", "cannot be read"]),
    "other arch": (lambda d: _edit_manifest(d, lambda m: m.update(arch="aarch64" if m["arch"] != "aarch64" else "x86_64")), None, [], ["built for", "export on this machine"]),
    "point outside": (None, "x,y\n1,2\n64,3\n", [], ["line 3", "outside the 64x64 image"]),
    "negative point": (None, "1,2\n-0.5,3\n", [], ["line 2", "outside"]),
    "malformed line": (None, "x,y\n1,2\n\n3;4\n", [], ["line 4", 'expected "x,y"']),
    "three columns": (None, "1,2,3\n", [], ["line 1", 'expected "x,y"']),
    "nan point": (None, "nan,2\n", [], ["line 1", "not finite"]),
    "unreadable image": (None, "1,2\n", ["--image", "/nonexistent/image.safetensors"], ["image", "cannot be read"]),
    "unknown flag": (None, "1,2\n", ["--frobnicate"], ["unknown argument", "--frobnicate"]),
}
if not torch.cuda.is_available():
    ERRORS["cuda package without cuda"] = (lambda d: _edit_manifest(d, lambda m: m.update(device="cuda", compute_capability="9.0")),
                                           None, [], ["CUDA is not available"])


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_are_one_line_and_exit_1(runner, exported, tmp_path, case):
    edit, csv_text, extra, words = ERRORS[case]
    d = tmp_path / "pkg"
    shutil.copytree(exported, d)
    if edit:
        edit(d)
    pts = tmp_path / "pts.csv"
    pts.write_text(csv_text or "x,y\n" + "\n".join(f"{i}.5,{2 * i}.25" for i in range(10)) + "\n")  # 10 -> bucket 16
    args = ["--manifest", d / "manifest.json", "--image", d / "reference.safetensors", "--points", pts, *extra]
    proc = run(runner, *args)
    assert proc.returncode == 1, f"{case}: exit {proc.returncode}\n{proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("depthpack_run: error: "), proc.stderr
    for w in words:
        assert w in lines[0], f"{case}: {w!r} not in {lines[0]!r}"
    assert proc.stdout == ""  # no partial output


def test_undecodable_image_file(runner, exported, tmp_path):
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (tmp_path / "pts.csv").write_text("1,2\n")
    proc = run(runner, "--manifest", exported / "manifest.json", "--image", tmp_path / "bad.png", "--points", tmp_path / "pts.csv")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert "cannot be decoded" in proc.stderr or "no OpenCV" in proc.stderr


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


def test_exporters_cpp_fallback_check_passes_with_the_real_runner(runner, exported):
    """The exporter's C++ fallback check (where Python cannot load packages) passes with this very
    runner on this export: fresh inputs per bucket and the chunked reference."""
    from depthpack.deploy.export import load_for_export
    from depthpack.deploy.package import cast_model, example_inputs
    from depthpack.deploy.selfcheck import cpp_check

    model = cast_model(load_for_export(None, "tiny", 0)[0], torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(11)
    fresh = {}
    for k in BUCKETS:
        images, points = example_inputs(model.cfg, 1, k, "cpu", g)
        fresh[f"images_k{k}"], fresh[f"points_k{k}"] = images, points
        with torch.no_grad():
            fresh[f"depth_k{k}"] = model.forward_packed(images, points, k)
    report = cpp_check(runner, exported / "manifest.json", fresh, BUCKETS)
    assert report["ok"], report
    assert report["reference"]["max_abs_diff"] < 1e-4 and all(b["max_abs_diff"] < 1e-4 for b in report["buckets"].values())


# ---- CUDA (the H200 through the device tool) ----------------------------------------------------------
@pytest.mark.gpu
def test_cuda_graph_equals_no_graph_and_reference(runner, tmp_path):
    d = finish_export(start_export(tmp_path / "tiny_cuda", device="cuda"), tmp_path / "tiny_cuda")
    ref = d / "reference.safetensors"
    outs = {}
    for flag in ([], ["--no-graph"]):
        proc = run(runner, "--manifest", d / "manifest.json", "--check", ref, "--image", ref,
                   "--points", write_csv(tmp_path / "p.csv", load_file(str(ref))["points"][0].numpy()),
                   "--out", tmp_path / "o.csv", *flag)
        assert proc.returncode == 0 and ": OK" in proc.stderr, proc.stderr
        outs[bool(flag)] = read_out(tmp_path / "o.csv")
    np.testing.assert_array_equal(outs[True], outs[False])  # the graph replays the very same kernels


# ---- the header-only helpers (no libtorch: a few seconds) ---------------------------------------------
HELPERS_MAIN = r'''
#include "mini_json.h"
#include <iostream>
int main(int argc, char** argv) {  // sha256 of each file, then "ok"/"rejected" for each JSON text on stdin
  for (int i = 1; i < argc; ++i) std::cout << minijson::sha256_file(argv[i]) << "\n";
  for (std::string line; std::getline(std::cin, line);) {
    try { minijson::parse(line); std::cout << "ok\n"; } catch (const std::runtime_error&) { std::cout << "rejected\n"; }
  }
}
'''


def test_sha256_and_strict_json(tmp_path):
    import hashlib

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "t.cpp").write_text(HELPERS_MAIN)
    subprocess.run([cxx, "-std=c++20", "-O1", f"-I{ROOT / 'deploy_cpp'}", str(tmp_path / "t.cpp"), "-o", str(tmp_path / "t")], check=True)
    rng = np.random.default_rng(0)
    files = []
    for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 100_000):  # every padding case of SHA-256
        files.append(tmp_path / f"f{n}")
        files[-1].write_bytes(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    good = ['{"a": [1, -0.5e3, true, false, null, "\\u00e9\\ud83d\\ude00\\n"]}', "[]", " {} ", '{"x": {"y": [[]]}}']
    bad = ["{", "[1,]", '{"a": 1, "a": 2}', "01", "[1] x", '"\\x"', "{'a': 1}", "nan", "[1.]", '"\\ud800"', "", "[" * 100 + "]" * 100]
    proc = subprocess.run([str(tmp_path / "t"), *map(str, files)], input="\n".join(good + bad) + "\n",
                          capture_output=True, text=True, check=True)
    out = proc.stdout.splitlines()
    assert out[:len(files)] == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    assert out[len(files):] == ["ok"] * len(good) + ["rejected"] * len(bad)
