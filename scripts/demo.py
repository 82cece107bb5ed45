"""The main job end to end on the embedded default (`make demo`):

    1. render synthetic scenes and train configs/demo.yaml          (train/train.py)
    2. accuracy of the packed, masked and dense paths, held-out      (python -m depthpack.eval)
    3. latency of masked vs packed (CPU rows; GPU rows on a GPU)     (python -m depthpack.bench)
    4. a robot's recording: a camera moving through held-out scenes  (python -m depthpack.bag run)
       (colour, depth, CameraInfo) as a ROS 2 MCAP bag, the trained model over every frame:
       accuracy at the queried points and per-frame latency
    5. export .pt2 packages + ONNX, build the C++ runner, check it   (export/export.py, deploy_cpp/)
       (on a GPU the packages compile from the start, from the untrained model, in the background at
       low priority: they hold code, not weights, and the export after training gives them the
       trained weights: --reuse-packages)
    6. runs/demo/report.md with the tables, the figures and how long each step took

Each step runs the same command a user would type, as a child process whose output is shown and
kept in OUT/logs/STEP.log; a failing step stops the demo with one line naming the step and its log.
A second `make demo` resumes training from its last checkpoint (done: nothing to redo) and reruns
the rest.
"""
from __future__ import annotations

if __name__ == "__main__":  # python scripts/demo.py: the imports below (torch) inside the one-line contract
    import sys as _sys

    from depthpack.core import cli as _cli
    _sys.exit(_cli.run("demo", _cli.lazy("demo:cli_main")))  # this file, importable as demo from scripts/

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from depthpack.core import cli
from depthpack.core.files import check_writable_dir
from depthpack.train.run_folder import untrained_checkpoint

ROOT = Path(__file__).resolve().parents[1]
# On a GPU the CPU recipe's data path (samples drawn on the host) leaves the GPU waiting: the same
# steps, batch and learning rate, with the scenes rendered once by every core into a store and held on
# the GPU, batches and query points made there (depthpack.train.device_data). Its accuracy is the CPU
# recipe's; its step costs the GPU's launches, not the host's sampling. {out}: the demo's folder.
GPU_RECIPE = ["threads=0", "graph=true", "data.cache_dir={out}/scenes", "data.device_cache=true", "ckpt_every=2300", "eval_every=0"]


STEPS = ("train", "eval", "export", "cpp", "bench", "bag")
# The bag step's recording: short, so a CPU runs it in seconds; frames at 4x the model's size, as a camera's
# frames are larger than the model's input; the query points a grid at the cells' centres.
BAG_FRAMES = 24
BAG_POINTS = "grid:16x12"


class StepFailed(RuntimeError):
    pass


def run_step(name: str, cmd: list[str], logs: Path, env: dict | None = None) -> float:
    """Run cmd from the repository root, tee its output to logs/NAME.log; return seconds taken."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    print(f"\n=== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read1(4096), b""):  # progress bars pass through as they come
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            f.write(chunk.decode(errors="replace"))
        rc = proc.wait()
    dt = time.perf_counter() - t0
    if rc != 0:
        raise StepFailed(f"step '{name}' failed (exit {rc}) after {dt:.0f} s; see {log}")
    print(f"=== {name}: done in {dt:.1f} s", flush=True)
    return dt


# The background steps run at low priority and off the first FOREGROUND_CORES cores (with 8 or more),
# and the benchmark beside them uses that many CPU threads: the host side of a measured call (the
# frames' copy into pinned memory, an OpenMP loop) must not wait on a thread the compiles preempted.
BACKGROUND_NICE = 10
FOREGROUND_CORES = 2


def _background_priority() -> None:
    os.nice(BACKGROUND_NICE)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 8:
        os.sched_setaffinity(0, cores[FOREGROUND_CORES:])


class Background:
    """A step started now and finished later (its output goes to its log only), at low priority (its
    child processes inherit it): on a GPU machine the packages' compile and the C++ build run from the
    start, beside training, evaluation and the benchmark."""

    def __init__(self, name: str, cmd: list[str], logs: Path):
        logs.mkdir(parents=True, exist_ok=True)
        self.name, self.log = name, logs / f"{name}.log"
        print(f"\n=== {name} (in the background): {' '.join(cmd)}", flush=True)
        self.t0 = time.perf_counter()
        self._f = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._f, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                     preexec_fn=_background_priority)

    def finish(self) -> float:
        rc = self.proc.wait()
        self._f.close()
        dt = time.perf_counter() - self.t0
        if rc != 0:
            raise StepFailed(f"step '{self.name}' failed (exit {rc}) after {dt:.0f} s; see {self.log}")
        print(f"=== {self.name}: done in {dt:.1f} s (in the background)", flush=True)
        return dt


def last_json(log: Path) -> dict:
    """The last line of a log that parses as a JSON object (the CLIs end their output with one)."""
    for line in reversed(log.read_text().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return {}


def evaluate(ckpt: Path, out: Path, logs: Path, skip: list[str], times: dict[str, float]) -> None:
    """Accuracy of the packed, masked and dense paths on held-out scenes (and of the glance depth, the
    packed call's coarse map, where the model has one), and the selection figure."""
    from depthpack.core.checkpoint import stored_config

    if "eval" in skip:
        return
    glance = ["glance"] if stored_config(ckpt)["model"].get("glance_depth") else []
    times["evaluate"] = run_step("evaluate", [sys.executable, "-m", "depthpack.eval", "--checkpoint", str(ckpt),
                                              "--out", str(out / "eval"), "--queries", "16", "64", "256",
                                              "--paths", "packed", "masked", "dense", *glance], logs)
    t0 = time.perf_counter()
    selection_png(ckpt, out)
    times["selection figure"] = time.perf_counter() - t0


def bench(ckpt: Path, out: Path, logs: Path, device: str, beside_background: bool = False) -> float:
    """Latency of masked vs packed: on a GPU the ladder at the two target points, on a CPU the eager rows.
    beside_background: compiles run meanwhile (Background), so the benchmark keeps to FOREGROUND_CORES threads."""
    cmd = [sys.executable, "-m", "depthpack.bench", "--checkpoint", str(ckpt), "--device", device, "--out",
           str(out / "bench"), "--seconds", "0.2", "--repeats", "2"]
    if device == "cuda":
        cmd += ["--pairs", "1x256,8x512", "--cache-dir", str(out / "compile_cache"), "--rows",
                "masked-eager,masked-graph,packed-eager,packed-graph,packed-compile+graph,fast,fast@frames"]
    else:
        cmd += ["--queries", "16,64,256"]
    return run_step("bench", cmd, logs, env={"OMP_NUM_THREADS": str(FOREGROUND_CORES)} if beside_background else None)


def recording(ckpt: Path, out: Path, logs: Path, device: str, frames: int, times: dict[str, float],
              beside_background: bool = False) -> dict:
    """The robot's workflow: a recording of a camera moving through held-out synthetic scenes (JPEG colour,
    depth and CameraInfo at 4x the model's size, written as a ROS 2 MCAP bag), then `python -m
    depthpack.bag run` over it with the trained checkpoint. Returns the run's report (OUT.json: accuracy at
    the queried points against the bag's depth, per-frame latency, decode rate), {} where none was written."""
    from depthpack.bag import demo_recording
    from depthpack.core.checkpoint import stored_config

    rec, answered = out / "recording", out / "recording_depth"
    h, w = (4 * int(v) for v in stored_config(ckpt)["model"]["img_size"])
    t0 = time.perf_counter()
    made = demo_recording(rec, frames=frames, size=(h, w))
    times[f"recording ({frames} frames of {w}x{h}: colour, depth, CameraInfo as a ROS 2 MCAP bag)"] = time.perf_counter() - t0
    cmd = [sys.executable, "-m", "depthpack.bag", "run", str(rec), "--image-topic", made["image_topic"], "--depth-topic",
           made["depth_topic"], "--points", BAG_POINTS, "--checkpoint", str(ckpt), "--out", str(answered), "--device", device]
    env = {"OMP_NUM_THREADS": str(FOREGROUND_CORES)} if beside_background else None
    times["bag run (the trained model on every frame of the recording)"] = run_step("bag", cmd, logs, env=env)
    report = answered.with_name(answered.name + ".json")
    return json.loads(report.read_text()) if report.is_file() else {}


def configure_runner(build_dir: Path, logs: Path) -> tuple[list[str], float]:
    """Configure deploy_cpp/ against the installed torch; returns the build command and seconds."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise StepFailed("cmake not found: install CMake >= 3.18 to build the C++ runner")
    dt = run_step("cpp_configure", [cmake, "-S", "deploy_cpp", "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                                    f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"], logs)
    return [cmake, "--build", str(build_dir), "-j", str(os.cpu_count() or 2)], dt


def runner_binary(build_dir: Path, logs: Path) -> Path:
    binary = build_dir / "depthpack_run"
    if not binary.is_file():
        raise StepFailed(f"the build finished but {binary} is missing; see {logs / 'cpp_build.log'}")
    return binary


def selection_png(ckpt: Path, out: Path) -> Path:
    """Which tokens the packer selected for one held-out image, with its anchors."""
    from depthpack.core.checkpoint import load_model
    from depthpack.data import make_dataset, sample_queries
    from depthpack.eval.evaluate import data_config
    from depthpack.eval.viz import selection_figure

    model = load_model(ckpt).eval()
    data = data_config(ckpt, None, [])
    mc = model.cfg
    ds = make_dataset(data, "val", mc.img_size, mc.min_depth, mc.max_depth)
    sample = ds[0]
    q = max(1, mc.buckets[len(mc.buckets) // 2] // 2)
    pts = sample_queries(sample["valid"], sample["image"], q, torch.Generator().manual_seed(0))
    return selection_figure(out / "selection.png", model, sample["image"], pts)


def bag_section(r: dict | None, out: Path) -> list[str]:
    """The report's section on the recording: accuracy, per-frame latency, decode rate and the outputs."""
    if not r:
        return []
    lat, acc, pairing = r["latency_ms"], r.get("accuracy") or {}, r["pairing"]

    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    bag, csv = Path(r["out"]), Path(r["csv"])
    return ["## A robot's recording: `python -m depthpack.bag run`", "",
            f"{r['frames']} frames of a camera moving through held-out synthetic scenes (`{rel_to(Path(r['bag']), out)}`: "
            f"JPEG colour, 16UC1 depth, CameraInfo; {pairing['paired']} colour-depth pairs), {r['points_per_frame']} "
            f"query points a frame, the trained model on `{r['device']}`.", "",
            "| AbsRel | delta1 | points scored | latency median ms | p90 ms | first call ms | decode frames/s | run frames/s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| {num(acc.get('abs_rel'), '.4f')} | {num(acc.get('d1'), '.4f')} | {acc.get('points', 0)} | "
            f"{num(lat.get('median_ms'), '.1f')} | {num(lat.get('p90_ms'), '.1f')} | {num(lat.get('first_call_ms'), '.1f')} | "
            f"{num(r.get('decode_frames_per_s'), '.1f')} | {num(r.get('run_frames_per_s'), '.2f')} |", "",
            "Accuracy at the queried points against the bag's depth (valid and inside the model's range), per frame "
            "then averaged; latency of one predict call plus its device sync (the first call apart); decode: the "
            "colour frames, one core.",
            f"Outputs: the bag with the answers on `{r['answer_topic']}` (PointCloud2) `{rel_to(bag, out)}`, the CSV "
            f"`{rel_to(csv, out)}`, the report `{rel_to(bag.with_name(bag.name + '.json'), out)}`.", ""]


def band_table(result: dict) -> list[str]:
    """AbsRel (anchors on) on uniform points beside the depth-edge band's, per path and Q."""
    bands = result.get("bands", {})
    if set(bands) != {"uniform", "edge"}:
        return []

    def get(band, path, q):
        return next((f"{r['abs_rel']:.4f}" for r in bands[band]["rows"] if r["path"] == path and r["queries"] == q
                     and r["anchors"] is not False), "-")
    paths = [p for p in ("packed", "dense", "glance") if any(r["path"] == p for r in bands["uniform"]["rows"])]
    lines = [f"AbsRel on uniform points and in the depth-edge band (within {result['band']['radius']} px of a depth "
             f"discontinuity):", "", "| Q | " + " | ".join(f"{p} uniform | {p} edge band" for p in paths) + " |",
             "|" + " --- |" * (1 + 2 * len(paths))]
    for q in sorted({r["queries"] for r in bands["uniform"]["rows"]}):
        lines.append(f"| {q} | " + " | ".join(f"{get('uniform', p, q)} | {get('edge', p, q)}" for p in paths) + " |")
    return lines + [""]


def write_report(out: Path, times: dict[str, float], info: dict) -> Path:
    lines = ["# depthpack demo report", "",
             f"Machine: {info['machine']}. torch {torch.__version__}. Written {time.strftime('%Y-%m-%d %H:%M:%S')}.", "",
             "## Time per step", "", "| step | seconds |", "| --- | --- |"]
    lines += [f"| {k} | {v:.1f} |" for k, v in times.items()]
    lines += [f"| **total (wall clock; steps marked \"during\" overlap others)** | **{info['wall_s']:.1f}** |", ""]
    train = info.get("train", {})
    if train:
        lines += ["## Training", "", f"{info.get('recipe', 'configs/demo.yaml')}: {json.dumps(train)}", ""]
    if (out / "eval" / "eval.md").is_file():
        lines += ["## Accuracy on held-out synthetic scenes (packed vs masked vs dense)", ""]
        lines += band_table(json.loads((out / "eval" / "eval.json").read_text()))
        lines += [(out / "eval" / "eval.md").read_text().strip(), ""]
        lines += [f"![depth]({rel_to(p, out)})" for p in sorted((out / "eval").glob("eval*.png"))] + [""]
    if (out / "selection.png").is_file():
        lines += ["## What the packer selected", "", f"![selection]({rel_to(out / 'selection.png', out)})", ""]
    lines += ["## Deployment: AOTInductor packages and the C++ runner", "", info.get("export", "not run"), ""]
    if info.get("cpp"):
        lines += ["```", info["cpp"].strip(), "```", ""]
    bench_md = sorted((out / "bench").glob("*.md"))
    if bench_md:
        lines += ["## Latency: masked vs packed", ""] + [p.read_text().strip() for p in bench_md] + [""]
        lines += [f"![latency]({rel_to(p, out)})" for p in sorted((out / "bench").glob("*.png"))] + [""]
    lines += bag_section(info.get("bag"), out)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = cli.Parser(prog="python scripts/demo.py", name="demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/demo", help="output folder (report.md lands here)")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--skip", nargs="*", default=[], choices=STEPS,
                    help="steps to skip (their earlier outputs are reused where present)")
    ap.add_argument("--bag-frames", type=int, default=BAG_FRAMES, help="frames of the bag step's recording")
    a = ap.parse_args(argv)
    if a.bag_frames < 1:
        ap.error(f"--bag-frames {a.bag_frames}: must be >= 1")
    return a


def train_command(config: str, ckpt: Path, out: Path, out_arg: str, cuda: bool) -> tuple[list[str], str]:
    """The train step's command (resuming), and the recipe line of the report: on a GPU the GPU recipe."""
    cmd = [sys.executable, "train/train.py", "--config", config, f"out_dir={ckpt}", "resume=true"]
    if not cuda:
        return cmd, f"`{config}`"
    return cmd + [r.format(out=out) for r in GPU_RECIPE], f"`{config}` with the GPU recipe `{' '.join(GPU_RECIPE).format(out=out_arg)}`"


def compile_packages_early(config: str, out: Path, logs: Path, device: str) -> Background:
    """The packages' code, compiled from the untrained model while training, evaluation and the benchmark
    run (no ONNX: that holds weights); the export after them reuses the packages with the trained weights."""
    untrained = untrained_checkpoint(config, out / "untrained")
    return Background("compile_packages", [sys.executable, "export/export.py", "--checkpoint", str(untrained), "--out",
                                           str(out / "export_untrained"), "--device", device], logs)


def start_runner_build(out: Path, logs: Path, cuda: bool, times: dict[str, float]) -> tuple[Background | None, Path | None]:
    """Configure the C++ runner, then build it: in the background on a GPU machine; on a CPU now (with two
    cores a build beside them would slow every measured step). Returns (the background build, the binary)."""
    build_cmd, times["C++ runner configure"] = configure_runner(out / "cpp_build", logs)
    if cuda:
        return Background("cpp_build", build_cmd, logs), None
    times["C++ runner build"] = run_step("cpp_build", build_cmd, logs)
    return None, runner_binary(out / "cpp_build", logs)


def export(ckpt: Path, out: Path, logs: Path, device: str, reuse: bool, times: dict[str, float], info: dict) -> None:
    """The trained checkpoint as .pt2 packages, ONNX and a manifest, self-checked (reuse: the packages
    compiled early from the untrained model, given the trained weights)."""
    export_dir = out / "export"
    cmd = [sys.executable, "export/export.py", "--checkpoint", str(ckpt), "--out", str(export_dir), "--device", device, "--onnx"]
    cmd += ["--reuse-packages", str(out / "export_untrained")] if reuse else []
    # on a GPU Python loads the packages for the self-check (their C++ runtime is linked in), so the
    # C++ build need not end first
    times["export (trained weights + ONNX + self-check)" if reuse else "export (.pt2 + ONNX)"] = run_step("export", cmd, logs)
    info["export"] = (f"Packages, weights, ONNX and manifest in `{rel_to(export_dir, out)}`; before writing the "
                      "manifest the export ran each package against eager on fresh inputs and on the reference (log: "
                      f"`{rel_to(logs / 'export.log', out)}`)."
                      + (f" The packages were compiled from the untrained model in the background from the start "
                         f"(`{rel_to(out / 'export_untrained', out)}`) and given the trained weights (`--reuse-packages`)."
                         if reuse else ""))


def runner_check(binary: Path, out: Path, logs: Path, times: dict[str, float], info: dict) -> None:
    """The C++ runner on the export: the reference check, its timing, and the image file through OpenCV."""
    export_dir = out / "export"
    check = [str(binary), "--manifest", str(export_dir / "manifest.json"), "--check",
             str(export_dir / "reference.safetensors"), "--bench", "50"]
    from_png = ["--image", str(export_dir / "reference.png"), "--points", str(export_dir / "reference_points.csv"),
                "--out", str(out / "cpp_depths.csv")]
    try:  # the image file through OpenCV, as a robot would, plus the reference check
        times["C++ runner parity"] = run_step("cpp_check", check + from_png, logs)
    except StepFailed:
        if "no OpenCV" not in (logs / "cpp_check.log").read_text():
            raise
        times["C++ runner parity"] = run_step("cpp_check", check, logs)  # a build without OpenCV
    info["cpp"] = (logs / "cpp_check.log").read_text()[-2000:]


def main(argv: list[str] | None = None) -> Path:
    a = parse_args(argv)
    t_start = time.perf_counter()
    out = (ROOT / a.out).resolve() if not Path(a.out).is_absolute() else Path(a.out)
    logs = out / "logs"
    check_writable_dir(out, "--out")  # a file in the way: one line naming it, not [Errno 17]
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    info = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores"
            + (f", {torch.cuda.get_device_name(0)}" if cuda else ", no GPU")}
    times: dict[str, float] = {}
    ckpt = out / "train"
    train_cmd, info["recipe"] = train_command(a.config, ckpt, out, a.out, cuda)
    # on a GPU machine the packages and the C++ runner compile in the background from the start
    compile_early = (compile_packages_early(a.config, out, logs, device)
                     if cuda and "export" not in a.skip and "train" not in a.skip else None)
    cpp_build, binary = start_runner_build(out, logs, cuda, times) if "cpp" not in a.skip else (None, None)
    if "train" not in a.skip:
        times["train"] = run_step("train", train_cmd, logs)
        info["train"] = last_json(logs / "train.log")
    # the evaluation, the benchmark and the recording need only the checkpoint: on a GPU they run while
    # the packages and the C++ runner still compile (at low priority, so the measured steps keep their cores)
    evaluate(ckpt, out, logs, a.skip, times)
    beside = compile_early is not None or cpp_build is not None
    if "bench" not in a.skip:
        times["latency benchmark" + (f" ({FOREGROUND_CORES} CPU threads; packages and C++ runner compiling on the "
                                     f"other cores, nice {BACKGROUND_NICE})" if beside else "")] = bench(ckpt, out, logs, device, beside)
    if "bag" not in a.skip:
        info["bag"] = recording(ckpt, out, logs, device, a.bag_frames, times, beside)
    if compile_early is not None:
        times["compile packages (untrained model, from the start, in the background)"] = compile_early.finish()
    if "export" not in a.skip:
        export(ckpt, out, logs, device, compile_early is not None, times, info)
    if cpp_build is not None:
        times["C++ runner build (from the start, in the background)"] = cpp_build.finish()
        binary = runner_binary(out / "cpp_build", logs)
    if binary is not None:
        runner_check(binary, out, logs, times, info)
    info["wall_s"] = time.perf_counter() - t_start
    report = write_report(out, times, info)
    print(f"\nreport: {report}")
    return report


def rel_to(path: Path, base: Path) -> str:
    return os.path.relpath(path, base)


def cli_main(argv: list[str] | None = None) -> int:
    """main with the house's error contract (one line `demo: error: WHAT`, exit 1), a failed step included."""
    try:
        return cli.run("demo", main, argv)
    except StepFailed as e:
        cli.fail("demo", e)

