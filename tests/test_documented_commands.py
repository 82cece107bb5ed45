"""Every shell command the docs show works as written: each command of README.md's and docs/*.md's ```bash
blocks runs with bash, exactly as written, in a temporary folder that holds copies of the repository's
configs, scripts, docs, Makefile, train/, export/ and deploy_cpp/, and tiny stand-ins for what the commands
name: checkpoints (runs/demo, runs/vits, runs/scale, ...: the tiny preset, untrained), exports (out/vits,
out/demo: a CPU export of that checkpoint; out/cam: the same as 640x480 bgr8 frame packages), ROS 2 bags
(recording/, run1/, run2/), a frame, points, raw frames and a video, a benchmark's bench.json. The C++ runner
is built there by the docs' own cmake commands.

Each command is classified by RULES, a short ordered list of patterns, each with its reason:
  run   in full, on the stand-ins;
  args  up to argument parsing: a command that needs a CUDA GPU or a Jetson, takes more than about a minute
        on 2 CPU cores, or writes outside the test's folder. Python commands run as written with
        ARGS_HOOK (a sitecustomize): every argparse parser of this repository stops the command right after
        a successful parse (the train command after its config validation too, load_train_config; the frontier
        after its plan's, load_plan, which builds each run's training config), so an
        unknown flag, a bad value or a bad config key fails as it would for the user; `--help` could not do
        that (argparse prints help before it looks at unknown flags). Scripts run the same way, so each
        depthpack command inside them is checked. make runs as `make -n`; depthpack_run with `--help`
        appended (it refuses an unknown flag before it reaches the --help);
  not run: a command that installs software or needs a Jetson's toolchain; the reason is in the test id.
A command no rule matches fails the test, saying how to classify it, so new commands in the docs are
picked up. Identical commands on several pages run once; the ids name every place they are written.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = ("bash", "sh", "shell")
RUN, ARGS, NOT_RUN = "run", "args", "not run"
pytestmark = pytest.mark.slow  # a C++ build, two tiny exports and about fifty commands: a few minutes

# (pattern searched in each `&&` part of a command, kind, why); the first rule that matches a part decides it,
# and a command is as restricted as its most restricted part
RULES = [
    (r"^(sudo\s+)?apt-get\s|^pip3?\s|-m\s+venv\s|^\.\s|^source\s", NOT_RUN,
     "installs software; make test and .ci/run install the same packages"),
    (r"^nvcc\s|-DCMAKE_CUDA_COMPILER|import torch, triton", NOT_RUN, "a Jetson's toolchain (JetPack: nvcc, CUDA, Triton)"),
    (r"^(\w+=\S+\s+)*make\s", ARGS,
     "make -n: make test is this suite, make demo trains 9 minutes, make cross-aarch64 fetches an aarch64 torch"),
    (r"--device\s+cuda", ARGS, "needs a CUDA GPU"),
    (r"/opt/depthpack", ARGS, "a Jetson's export (docs/install.md)"),
    (r"scripts/(gpu_\w+|cpp_frame_loop)\.sh", ARGS, "a GPU run script"),
    (r"depthpack\.train\s.*configs/(demo|scale|vits_\w+)\.yaml|depthpack\.bench\s.*--preset\s+vits|scripts/demo\.py\s"
     r"|depthpack\.frontier\s.*configs/frontier_(cpu|gpu|h200)\w*\.yaml",
     ARGS, "trains or benchmarks a full-size model: minutes to hours on 2 CPU cores"),
    (r"\s/(tmp|data)/|=/(tmp|data)/", ARGS, "writes under /tmp or /data, outside the test's folder"),
    (r"--profile\s", ARGS, "needs a profile measured on a GPU (python scripts/gpu_profile.py)"),
    (r"^python3?\s+-m\s+depthpack\.\w+|^python3?\s+(train/train|export/export|scripts/\w+)\.py\s*|^cp\s|^cmake\s"
     r"|^deploy_cpp/build/depthpack_run\s|^[\w+]+\s+--version$", RUN, "runs on the stand-ins"),
]
HOW_TO_CLASSIFY = ("no rule of RULES in tests/test_documented_commands.py matches it: add a pattern with run (it "
                   "runs in about a minute or less on the stand-ins, which the world fixture makes), args and why "
                   "(a GPU, a Jetson, a long run, writes outside the test's folder) or not run and why")


# ---- reading the docs -------------------------------------------------------------------------------------
def _split(text: str, sep: str) -> list[str]:
    """text cut at `sep` where it stands outside quotes and $( ): '#' (a comment, at a word's start) or '&&'."""
    parts, start, quote, depth, i = [], 0, None, 0, 0
    while i < len(text):
        c = text[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif text.startswith("$(", i):
            depth += 1
        elif c == ")" and depth:
            depth -= 1
        elif not depth and text.startswith(sep, i) and (sep != "#" or i == 0 or text[i - 1].isspace()):
            parts.append(text[start:i])
            if sep == "#":
                return parts
            start = i + len(sep)
            i = start
            continue
        i += 1
    return parts + [text[start:]]


def shell_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every command in the page's shell blocks: continuations joined, comments dropped."""
    out, in_block, pending, first = [], False, "", 0
    for n, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*```\s*(\S*)", line)
        if fence:
            in_block = not in_block and fence.group(1) in SHELLS
            continue
        if not in_block:
            continue
        code = _split(line, "#")[0].rstrip()
        if not pending:
            first = n
        if code.endswith("\\"):
            pending += code[:-1].rstrip() + " "
            continue
        command = " ".join((pending + code).split())
        pending = ""
        if command:
            out.append((first, command))
    return out


@dataclass(frozen=True)
class Command:
    text: str
    where: tuple[str, ...]  # page:line of each place it is written
    kind: str
    why: str

    def __repr__(self) -> str:  # the test id: how it is checked, where it is written, the command
        how = {RUN: "run", ARGS: "args only", NOT_RUN: "not run", None: "UNCLASSIFIED"}[self.kind]
        return f"{how}: {self.where[0]}{'+' if len(self.where) > 1 else ''}: {self.text[:100]}"


def classify(text: str) -> tuple[str, str]:
    """(kind, why) of a command; a part that no rule matches: kind None."""
    order = {RUN: 0, ARGS: 1, NOT_RUN: 2}
    kind, why = RUN, "runs on the stand-ins"
    for part in (p.strip() for p in _split(text, "&&")):
        rule = next(((k, w) for pat, k, w in RULES if re.search(pat, part)), None)
        if rule is None:
            return None, f"{part!r}: {HOW_TO_CLASSIFY}"
        if order[rule[0]] > order[kind]:
            kind, why = rule
    return kind, why


def documented_commands() -> list[Command]:
    seen: dict[str, list[str]] = {}
    for page in PAGES:
        for n, text in shell_commands(page.read_text()):
            seen.setdefault(text, []).append(f"{page.relative_to(ROOT)}:{n}")
    return [Command(text, tuple(where), *classify(text)) for text, where in seen.items()]


COMMANDS = documented_commands()


def test_the_reader_finds_commands_joins_lines_drops_comments_and_classifies():
    page = ("text `python -m depthpack.eval --not-this`\n```bash\npython -m depthpack.eval --checkpoint runs/demo "
            "--queries 16  # packed\n# a comment line\npython -m depthpack.export --checkpoint runs/vits --out out/vits \\\n"
            "    --device cuda   # GPU\ncmake -S a -DX=\"$(python -c 'import torch # not a comment')\"\n```\n"
            "```python\nimport depthpack\n```\n")
    assert shell_commands(page) == [
        (3, "python -m depthpack.eval --checkpoint runs/demo --queries 16"),
        (5, "python -m depthpack.export --checkpoint runs/vits --out out/vits --device cuda"),
        (7, "cmake -S a -DX=\"$(python -c 'import torch # not a comment')\"")]
    assert classify("python -m depthpack.eval --checkpoint runs/demo")[0] == RUN
    assert classify("python -m depthpack.export --checkpoint runs/vits --out o --device cuda") == (ARGS, "needs a CUDA GPU")
    assert classify("python3 -m venv ~/dp && . ~/dp/bin/activate && pip install -U pip")[0] == NOT_RUN
    assert classify("python -m depthpack.frontier --plan configs/frontier_cpu.yaml --jobs 2")[0] == ARGS
    assert classify("python -m depthpack.frontier --plan configs/frontier_cpu_detail.yaml --jobs 2")[0] == ARGS
    assert classify("python -m depthpack.frontier --plan configs/frontier_tiny.yaml --runs r")[0] == RUN
    kind, why = classify("rm -rf runs")
    assert kind is None and "RULES in tests/test_documented_commands.py" in why


# ---- the stand-ins ----------------------------------------------------------------------------------------
FRAME = (480, 640)  # (h, w) of the bags' frames, the raw frames, the video and out/cam's frame packages
BAG_TOPICS = {"raw": "/camera/color/image_raw", "jpeg": "/camera/color/image_raw/compressed",
              "depth": "/camera/aligned_depth_to_color/image_raw", "info": "/camera/color/camera_info"}
TINY_OVERRIDES = ["model.buckets=[64]"]  # one package per export: the exports take seconds, not minutes


def _frames(n: int, seed: int = 0) -> list[np.ndarray]:
    """Smooth RGB frames uint8 [h,w,3]: gradients and a moving square (JPEG-friendly, never constant)."""
    h, w = FRAME
    y, x = np.mgrid[0:h, 0:w]
    out = []
    for i in range(n):
        f = np.stack([(x * 255 // w), (y * 255 // h), np.full_like(x, 40 * i + seed)], -1).astype(np.uint8)
        f[100 + 10 * i:200 + 10 * i, 200:300] = 230
        out.append(f)
    return out


def _bag(path: Path, n: int = 3) -> None:
    """A ROS 2 MCAP bag as a RealSense records it: raw and JPEG colour, aligned 16UC1 depth, CameraInfo."""
    from depthpack.data.rosbag import CAMERA_INFO, COMPRESSED, IMAGE, BagWriter

    h, w = FRAME
    K = np.array([[500.0, 0, w / 2], [0, 500.0, h / 2], [0, 0, 1]])
    with BagWriter(path, "mcap") as bw:
        raw, jpeg = bw.add(BAG_TOPICS["raw"], IMAGE), bw.add(BAG_TOPICS["jpeg"], COMPRESSED)
        depth, info = bw.add(BAG_TOPICS["depth"], IMAGE), bw.add(BAG_TOPICS["info"], CAMERA_INFO)
        for k, rgb in enumerate(_frames(n)):
            t = 1_700_000_000_000_000_000 + k * 100_000_000
            bw.write(raw, t, bw.image(rgb, "rgb8", t, "color"))
            bw.write(jpeg, t, bw.compressed(rgb, "jpeg", t, "color"))
            bw.write(depth, t, bw.image(np.full((h, w), 2.0 + k, np.float32), "16UC1", t, "color"))
            bw.write(info, t, bw.camera_info(K, w, h, t, "color"))


def _checkpoint(out: Path, extra: list[str] = ()) -> Path:
    from depthpack.train.run_folder import untrained_checkpoint

    return untrained_checkpoint(str(ROOT / "configs" / "tiny.yaml"), out, [*TINY_OVERRIDES, *extra])


def _export(work: Path, checkpoint: Path, out: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "depthpack.export", "--checkpoint", str(checkpoint), "--out", out, *extra]
    return subprocess.Popen(cmd, cwd=work, env=environment(work), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"a stand-in failed: {' '.join(proc.args)}\n{err[-3000:]}"


def environment(work: Path, hook: Path | None = None) -> dict[str, str]:
    """The shell of a user who installed depthpack: this checkout's package and the venv's commands first; TMPDIR
    and the scripts' WORK inside the test's folder, so nothing is written outside it."""
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([*([str(hook)] if hook else []), str(ROOT)]), "TMPDIR": str(work / "tmp"),
           "WORK": str(work / "tmp" / "script_work"), "PET_MASTER_PORT": str(_free_port()), "PYTHONUNBUFFERED": "1"}
    env.pop("DEPTHPACK_RUN", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:  # torchrun's rendezvous port: not the default 29500 another run may hold
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_world(work: Path) -> None:
    """The repository's non-package files and every stand-in the commands name, in work."""
    import cv2

    for name in ("configs", "scripts", "docs", "train", "export"):
        shutil.copytree(ROOT / name, work / name)
    shutil.copytree(ROOT / "deploy_cpp", work / "deploy_cpp", ignore=shutil.ignore_patterns("build*"))
    for name in ("Makefile", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, work / name)
    (work / "tmp").mkdir()
    demo = _checkpoint(work / "runs" / "demo").parent.parent
    for name in ("runs/demo/train", "runs/vits", "runs/vits2", "runs/tiny", "CKPT"):
        shutil.copytree(demo, work / name, ignore=shutil.ignore_patterns("train"))
    _checkpoint(work / "runs" / "scale", ["model.img_size=[256,256]", "model.buckets=[64,1024]"])  # 1024 patches
    exports = [_export(work, demo, "out/vits"), _export(work, demo, "out/cam", "--frame-size", f"{FRAME[1]}x{FRAME[0]}",
                                                        "--frame-format", "bgr8")]
    try:
        build = build_runner(work)
        for name in ("recording", "run1", "run2"):
            _bag(work / name)
        frames = _frames(3, seed=7)
        cv2.imwrite(str(work / "frame.png"), cv2.cvtColor(frames[0], cv2.COLOR_RGB2BGR))
        (work / "cam.bgr").write_bytes(b"".join(np.ascontiguousarray(f[..., ::-1]).tobytes() for f in frames))
        video = cv2.VideoWriter(str(work / "cam.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 10, FRAME[::-1])
        for f in frames:
            video.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
        video.release()
        (work / "pts.csv").write_text("x,y\n320,240\n10,470\n600.5,20.25\n")
        (work / "runs" / "bench_h200").mkdir()
        shutil.copy(ROOT / "docs" / "results" / "h200_bench.json", work / "runs" / "bench_h200" / "bench.json")
    finally:
        for proc in exports:
            _finish(proc)
    shutil.copytree(work / "out" / "vits", work / "out" / "demo")
    assert build.returncode == 0, f"the docs' cmake commands failed:\n{build.stdout[-3000:]}{build.stderr[-3000:]}"


def build_runner(work: Path) -> subprocess.CompletedProcess:
    """deploy_cpp/build/depthpack_run, by the docs' own configure command (install.md, deployment.md); two
    compile jobs (the docs' `-j`, unbounded, runs after it and finds nothing left to do)."""
    configure = next(c.text for c in COMMANDS if c.text.startswith("cmake -S deploy_cpp -B deploy_cpp/build")
                     and "CUDA" not in c.text)
    return subprocess.run(f"{configure} && cmake --build deploy_cpp/build -j 2", shell=True, executable="/bin/bash",
                          cwd=work, env=environment(work), capture_output=True, text=True, timeout=1200)


# ---- checking up to argument parsing ------------------------------------------------------------------------
ARGS_HOOK = '''import argparse, json, os, sys

_parse = argparse.ArgumentParser.parse_args
_OURS = tuple(os.environ["DEPTHPACK_ARGS_ROOTS"].split(os.pathsep))


def _note(**entry):
    with open(os.environ["DEPTHPACK_ARGS_LOG"], "a") as f:
        f.write(json.dumps(entry) + "\\n")


def parse_args(self, args=None, namespace=None):
    """A parser of this repository stops its command after a successful parse (train: and its config)."""
    if not os.path.abspath(sys._getframe(1).f_code.co_filename).startswith(_OURS):
        return _parse(self, args, namespace)  # torchrun's own parser, say: it goes on to start the command
    try:
        ns = _parse(self, args, namespace)
        if self.prog == "python -m depthpack.train":
            from depthpack.train.config import load_train_config
            load_train_config(ns.config, ns.overrides)
        if self.prog == "python -m depthpack.frontier":
            from depthpack.frontier import load_plan
            load_plan(ns.plan)
    except SystemExit as e:
        _note(prog=self.prog, ok=e.code in (0, None))
        raise
    except ValueError as e:
        _note(prog=self.prog, ok=False)
        print(f"{self.prog}: error: {e}", file=sys.stderr)
        sys.exit(1)
    _note(prog=self.prog, ok=True)
    print(f"{self.prog}: arguments parse; stopped there (checked up to argument parsing)", file=sys.stderr)
    sys.exit(0)


argparse.ArgumentParser.parse_args = parse_args
'''


def args_only(text: str) -> str:
    """The command as `args` runs it: make as make -n, depthpack_run with --help appended, the rest as written."""
    parts = []
    for part in (p.strip() for p in _split(text, "&&")):
        part = re.sub(r"^((\w+=\S+\s+)*)make\s", r"\1make -n ", part)
        parts.append(part + " --help" if re.match(r"^\S*depthpack_run\s", part) else part)
    return " && ".join(parts)


def runner_features(work: Path) -> dict[str, str]:
    """What the built depthpack_run has, as it says: {"libtorch": ..., "cuda": "0", "opencv": "1", "videoio": "0"}."""
    p = subprocess.run([str(work / "deploy_cpp" / "build" / "depthpack_run"), "--version"], capture_output=True,
                       text=True, timeout=60)
    return dict(kv.split("=", 1) for kv in p.stdout.split()[1:] if "=" in kv)


def needs_missing_opencv(text: str, features: dict[str, str]) -> str | None:
    """Why this build of depthpack_run cannot run the command in full (an image file or a video needs OpenCV)."""
    if not text.startswith("deploy_cpp/build/depthpack_run"):
        return None
    if "--video" in text and features.get("videoio") != "1":
        return "this depthpack_run was built without OpenCV's videoio (libopencv-videoio-dev)"
    if re.search(r"--image\s+\S+\.(png|jpe?g|bmp)\b", text) and features.get("opencv") != "1":
        return "this depthpack_run was built without OpenCV (libopencv-imgcodecs-dev)"
    return None


@dataclass
class Outcome:
    kind: str
    why: str
    shell: str
    proc: subprocess.CompletedProcess | None = None
    parsed: list | None = None  # args: the hook's notes
    seconds: float = 0.0


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """Every classified command, once, in the order of the docs, on the stand-ins."""
    work = tmp_path_factory.mktemp("documented")
    t0 = time.perf_counter()
    make_world(work)
    print(f"stand-ins made in {time.perf_counter() - t0:.0f} s")
    hook = tmp_path_factory.mktemp("hook")
    (hook / "sitecustomize.py").write_text(ARGS_HOOK)
    features = runner_features(work)
    results = {}
    for c in COMMANDS:
        if c.kind in (None, NOT_RUN):
            continue
        kind, why = c.kind, c.why
        missing = needs_missing_opencv(c.text, features) if kind == RUN else None
        if missing:
            kind, why = ARGS, missing
        shell, env = c.text, environment(work)
        if kind == ARGS:
            log = hook / f"parsed_{len(results)}.jsonl"
            shell = args_only(c.text)
            env = {**environment(work, hook), "DEPTHPACK_ARGS_LOG": str(log),
                   "DEPTHPACK_ARGS_ROOTS": os.pathsep.join([str(ROOT), str(work)])}
        t0 = time.perf_counter()
        proc = subprocess.run(shell, shell=True, executable="/bin/bash", cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)
        seconds = time.perf_counter() - t0
        parsed = None
        if kind == ARGS:
            parsed = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
        results[c.text] = Outcome(kind, why, shell, proc, parsed, seconds)
    return results


@pytest.mark.parametrize("command", COMMANDS, ids=repr)
def test_documented_command_works_as_written(command, outcomes):
    if command.kind is None:
        pytest.fail(f"{command.text} ({', '.join(command.where)}): {command.why}")
    if command.kind == NOT_RUN:
        pytest.skip(f"not run: {command.why}")
    o = outcomes[command.text]
    how = "run in full" if o.kind == RUN else f"checked up to argument parsing: {o.why}"
    print(f"{command.text} ({', '.join(command.where)}): {how}; {o.seconds:.1f} s")  # -rA shows it
    p = o.proc
    said = f"{o.shell}\nexit {p.returncode}\nstdout: {p.stdout[-2500:]}\nstderr: {p.stderr[-2500:]}"
    if o.kind == RUN:
        assert p.returncode == 0, said
        return
    python = not re.match(r"^((\w+=\S+\s+)*)make\s|^\S*depthpack_run\s", command.text)
    if not python:
        assert p.returncode == 0, f"checked up to argument parsing ({o.why}):\n{said}"
        return
    bad = [e for e in o.parsed if not e["ok"]]
    assert o.parsed and not bad, f"checked up to argument parsing ({o.why}): {bad or 'no depthpack parser ran'}\n{said}"
    assert p.returncode == 0 or "scripts/" in command.text, said  # a script goes on past a step's exit code
