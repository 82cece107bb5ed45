"""The main job end to end on the embedded default (`make demo`):

    1. render synthetic scenes and train configs/demo.yaml          (train/train.py)
    2. accuracy of the packed, masked and dense paths, held-out      (python -m depthpack.eval)
    3. latency of masked vs packed (CPU rows; GPU rows on a GPU)     (python -m depthpack.bench)
    4. export .pt2 packages + ONNX, build the C++ runner, check it   (export/export.py, deploy_cpp/)
       (on a GPU the packages compile from the start, from the untrained model, in the background at
       low priority: they hold code, not weights, and the export after training gives them the
       trained weights: --reuse-packages)
    5. runs/demo/report.md with the tables, the figures and how long each step took

Each step runs the same command a user would type, as a child process whose output is shown and
kept in OUT/logs/STEP.log; a failing step stops the demo with one line naming the step and its log.
A second `make demo` resumes training from its last checkpoint (done: nothing to redo) and reruns
the rest.
"""
from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[1]
# On a GPU the CPU recipe's data path (samples drawn on the host) leaves the GPU waiting: the same
# steps, batch and learning rate, with the scenes rendered once by every core into a store and held on
# the GPU, batches and query points made there (depthpack.train.device_data). Its accuracy is the CPU
# recipe's; its step costs the GPU's launches, not the host's sampling. {out}: the demo's folder.
GPU_RECIPE = ["threads=0", "graph=true", "data.cache_dir={out}/scenes", "data.device_cache=true", "ckpt_every=2300", "eval_every=0"]


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


def untrained_checkpoint(config: str, out: Path) -> Path:
    """The recipe's model, untrained (seeded), as a checkpoint in out: what the GPU demo compiles into
    packages while training runs, and scripts/gpu_export_timing.sh times (the packages hold code, which
    depends on the model's shapes, not its weights)."""
    from .core.checkpoint import save_checkpoint
    from .core.config import to_dict
    from .core.model import DepthPack
    from .train.config import load_train_config

    cfg = load_train_config(config)
    torch.manual_seed(cfg.seed)
    mcfg = cfg.model_config()
    return save_checkpoint(out, 0, DepthPack(mcfg), {}, {"model": to_dict(mcfg), "train": to_dict(cfg)})


def evaluate(ckpt: Path, out: Path, logs: Path, skip: list[str], times: dict[str, float]) -> None:
    """Accuracy of the packed, masked and dense paths on held-out scenes, and the selection figure."""
    if "eval" in skip:
        return
    times["evaluate"] = run_step("evaluate", [sys.executable, "-m", "depthpack.eval", "--checkpoint", str(ckpt),
                                              "--out", str(out / "eval"), "--queries", "16", "64", "256"], logs)
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
                "masked-eager,masked-graph,packed-eager,packed-graph,packed-compile+graph,packed-compile+graph@frames"]
    else:
        cmd += ["--queries", "16,64,256"]
    return run_step("bench", cmd, logs, env={"OMP_NUM_THREADS": str(FOREGROUND_CORES)} if beside_background else None)


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
    from .core.checkpoint import load_model
    from .data import make_dataset, sample_queries
    from .eval.evaluate import data_config
    from .eval.viz import selection_figure

    model = load_model(ckpt).eval()
    data = data_config(ckpt, None, [])
    mc = model.cfg
    ds = make_dataset(data, "val", mc.img_size, mc.min_depth, mc.max_depth)
    sample = ds[0]
    q = max(1, mc.buckets[len(mc.buckets) // 2] // 2)
    pts = sample_queries(sample["valid"], sample["image"], q, torch.Generator().manual_seed(0))
    return selection_figure(out / "selection.png", model, sample["image"], pts)


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
        lines += ["## Accuracy on held-out synthetic scenes (packed vs masked vs dense)", "",
                  (out / "eval" / "eval.md").read_text().strip(), ""]
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
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m depthpack.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/demo", help="output folder (report.md lands here)")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--skip", nargs="*", default=[], choices=("train", "eval", "export", "cpp", "bench"),
                    help="steps to skip (their earlier outputs are reused where present)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    out = (ROOT / a.out).resolve() if not Path(a.out).is_absolute() else Path(a.out)
    logs = out / "logs"
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    info = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores"
            + (f", {torch.cuda.get_device_name(0)}" if cuda else ", no GPU")}
    times: dict[str, float] = {}
    ckpt = out / "train"

    # on a GPU machine: the GPU recipe; the packages and the C++ runner compile in the background
    train_cmd = [py, "train/train.py", "--config", a.config, f"out_dir={ckpt}", "resume=true"]
    if cuda:
        train_cmd += [r.format(out=out) for r in GPU_RECIPE]
        info["recipe"] = f"`{a.config}` with the GPU recipe `{' '.join(GPU_RECIPE).format(out=a.out)}`"
    else:
        info["recipe"] = f"`{a.config}`"
    cpp_build, binary, compile_early = None, None, None
    export_dir, untrained_export = out / "export", out / "export_untrained"
    if cuda and "export" not in a.skip and "train" not in a.skip:
        # the packages' code, compiled from the untrained model while training, evaluation and the
        # benchmark run (no ONNX: that holds weights); the export after them reuses the packages with the
        # trained weights
        untrained = untrained_checkpoint(a.config, out / "untrained")
        compile_early = Background("compile_packages", [py, "export/export.py", "--checkpoint", str(untrained), "--out",
                                                        str(untrained_export), "--device", device], logs)
    if "cpp" not in a.skip:
        build_cmd, times["C++ runner configure"] = configure_runner(out / "cpp_build", logs)
        if cuda:
            cpp_build = Background("cpp_build", build_cmd, logs)
        else:  # built before the export, which checks the packages with it where Python cannot load them
            times["C++ runner build"] = run_step("cpp_build", build_cmd, logs)
            binary = runner_binary(out / "cpp_build", logs)
    if "train" not in a.skip:
        times["train"] = run_step("train", train_cmd, logs)
        info["train"] = last_json(logs / "train.log")
    # the evaluation and the benchmark need only the checkpoint: on a GPU they run while the packages
    # and the C++ runner still compile (at low priority, so the measured steps keep their cores)
    evaluate(ckpt, out, logs, a.skip, times)
    if "bench" not in a.skip:
        beside = compile_early is not None or cpp_build is not None
        times["latency benchmark" + (f" ({FOREGROUND_CORES} CPU threads; packages and C++ runner compiling on the "
                                     f"other cores, nice {BACKGROUND_NICE})" if beside else "")] = bench(ckpt, out, logs, device, beside)
    if compile_early is not None:
        times["compile packages (untrained model, from the start, in the background)"] = compile_early.finish()
    if "export" not in a.skip:
        cmd = [py, "export/export.py", "--checkpoint", str(ckpt), "--out", str(export_dir), "--device", device, "--onnx"]
        cmd += ["--cpp-runner", str(binary)] if binary else []
        cmd += ["--reuse-packages", str(untrained_export)] if compile_early is not None else []
        # on a GPU Python loads the packages for the self-check (their C++ runtime is linked in), so the
        # C++ build need not end first
        times["export (trained weights + ONNX + self-check)" if compile_early is not None
              else "export (.pt2 + ONNX)"] = run_step("export", cmd, logs)
        info["export"] = (f"Packages, weights, ONNX and manifest in `{rel_to(export_dir, out)}`; before writing the "
                          "manifest the export ran each package against eager on fresh inputs and on the reference (log: "
                          f"`{rel_to(logs / 'export.log', out)}`)."
                          + (f" The packages were compiled from the untrained model in the background from the start "
                             f"(`{rel_to(untrained_export, out)}`) and given the trained weights (`--reuse-packages`)."
                             if compile_early is not None else ""))
    if cpp_build is not None:
        times["C++ runner build (from the start, in the background)"] = cpp_build.finish()
        binary = runner_binary(out / "cpp_build", logs)
    if binary is not None:
        man = export_dir / "manifest.json"
        check = [str(binary), "--manifest", str(man), "--check", str(export_dir / "reference.safetensors"), "--bench", "50"]
        from_png = ["--image", str(export_dir / "reference.png"), "--points", str(export_dir / "reference_points.csv"),
                    "--out", str(out / "cpp_depths.csv")]
        try:  # the image file through OpenCV, as a robot would, plus the reference check
            times["C++ runner parity"] = run_step("cpp_check", check + from_png, logs)
        except StepFailed:
            if "no OpenCV" not in (logs / "cpp_check.log").read_text():
                raise
            times["C++ runner parity"] = run_step("cpp_check", check, logs)  # a build without OpenCV
        info["cpp"] = (logs / "cpp_check.log").read_text()[-2000:]
    info["wall_s"] = time.perf_counter() - t_start
    report = write_report(out, times, info)
    print(f"\nreport: {report}")
    return report


def rel_to(path: Path, base: Path) -> str:
    return os.path.relpath(path, base)


if __name__ == "__main__":
    try:
        main()
    except (StepFailed, ValueError) as e:
        print(f"demo: {e}", file=sys.stderr)
        sys.exit(1)
