"""The fuzz targets of the C++ runner's readers (deploy_cpp/fuzz), replayed: the committed corpus and
every regression input, under ASan and UBSan, on any machine.

deploy_cpp/fuzz/run.sh fuzzes with libFuzzer (clang); here the same targets are built with the
default compiler (g++) and fuzz/replay.cpp's main instead (no libtorch: about a minute on 2 cores;
DEPTHPACK_FUZZ_BUILD=DIR builds into and reuses DIR), and each runs once on every file of
corpus/<target>/ and regressions/<target>/: a crash, a sanitizer report or an exception other than
depthpack::Error fails the test. Also: the corpus holds seeds of real exports for every target,
and each regression input is named for what it was.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "deploy_cpp" / "fuzz"
TARGETS = ("manifest", "safetensors", "points", "frames")
pytestmark = pytest.mark.slow  # one CMake build of the readers


@pytest.fixture(scope="module")
def replay(tmp_path_factory) -> Path:
    """The folder of the replay builds of the fuzz targets (fuzz_manifest, ...)."""
    if shutil.which("cmake") is None:
        pytest.fail("cmake is not installed (apt-get install cmake)")
    build = Path(os.environ.get("DEPTHPACK_FUZZ_BUILD") or tmp_path_factory.mktemp("fuzz") / "build")
    # build type None (-O0): nlohmann/json under ASan compiles much faster than optimized, and replays are short
    for cmd in (["cmake", "-S", ROOT / "deploy_cpp", "-B", build, "-DDEPTHPACK_FUZZ=ON", "-DCMAKE_BUILD_TYPE=None"],
                ["cmake", "--build", build, "-j", str(min(4, os.cpu_count() or 1))]):
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
        if proc.returncode:
            pytest.fail(f"{' '.join(map(str, cmd[:2]))} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return build / "fuzz"


@pytest.mark.parametrize("target", TARGETS)
def test_corpus_and_regressions_replay_cleanly(replay, target):
    folders = [FUZZ / "corpus" / target] + ([FUZZ / "regressions" / target] if (FUZZ / "regressions" / target).is_dir() else [])
    n = sum(len(list(f.iterdir())) for f in folders)
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:exitcode=86", "UBSAN_OPTIONS": "halt_on_error=1:exitcode=87:print_stacktrace=1"}
    proc = subprocess.run([str(replay / f"fuzz_{target}"), *map(str, folders)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"fuzz_{target} exit {proc.returncode}:\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip() == f"replayed {n} inputs" and proc.stderr == "", proc.stdout + proc.stderr


def test_every_target_has_seeds_of_real_exports():
    for target in TARGETS:
        seeds = sorted(p.name for p in (FUZZ / "corpus" / target).glob("seed_*"))
        assert seeds, f"corpus/{target} has no seed (deploy_cpp/fuzz/make_seeds.py writes them)"
    from depthpack.deploy.contract import FORMAT, FORMAT_SHARED, map_package, read_manifest

    # valid manifests of this format (a one-way model's, with its map-only package) and of the one before
    seeds = {p.name: read_manifest(p) for p in (FUZZ / "corpus" / "manifest").glob("seed_*_manifest.json")}
    assert seeds["seed_oneway_manifest.json"]["format"] == FORMAT and map_package(seeds["seed_oneway_manifest.json"])
    assert seeds["seed_images_manifest.json"]["format"] == FORMAT_SHARED


def test_regression_inputs_are_named():
    """A regression input's name says what it was (crash-<sha1> from libFuzzer renamed), so a
    failure here points at the bug it guards against."""
    folder = FUZZ / "regressions"
    for f in (folder.rglob("*") if folder.is_dir() else []):
        if f.is_file():
            assert f.parent.name in TARGETS and not f.name.startswith(("crash-", "leak-", "timeout-", "oom-")), f
