"""The exported program of one bucket: PackedForward, example inputs, torch.export with a check that
the graph is static, and AOTInductor's compile into a .pt2."""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn as nn

from ..core.config import ModelConfig
from ..core.files import process_temporary_dir
from ..core.model import DepthPack
from ..core.preprocess import frames_to_images, scale_focal, scale_points
from .contract import focal_entry

# ATen ops that read tensor values into the host or make shapes data-dependent (by base name)
FORBIDDEN_OPS = {"nonzero", "nonzero_static", "_local_scalar_dense", "item", "unique", "_unique", "_unique2",
                 "unique_consecutive", "unique_dim", "masked_select", "_assert_scalar", "_assert_async",
                 "sym_constrain_range", "sym_constrain_range_for_size", "argwhere"}


class ExportError(ValueError):
    """Anything that stops an export: the message says what and what to do."""


class _Forward(nn.Module):
    """A package's function over the model: its inputs in the model's terms first (model_inputs)."""

    def __init__(self, model: DepthPack, frame: dict | None = None):
        super().__init__()
        self.model, self.frame = model, frame

    def model_inputs(self, inputs: torch.Tensor, points: torch.Tensor | None, focal: torch.Tensor | None):
        """(images, points, focal) at the model's size: frames preprocessed, points and focal scaled."""
        if self.frame is None:
            return inputs, points, focal
        size, frame_size = tuple(self.model.cfg.img_size), tuple(self.frame["size"])
        return (frames_to_images(inputs, size, self.frame["color"]),
                scale_points(points, frame_size, size) if points is not None else None,
                scale_focal(focal, frame_size, size) if focal is not None else None)


class PackedForward(_Forward):
    """The exported function: images [B,3,H,W] f32 (or, with frame, uint8 frames [B,h,w,3] in the
    frame's channel order, preprocessed inside), points [B,K,2] f32 in their pixels, and for a model
    with a focal input focal [B] f32 in their pixels (0 = unknown) -> depth [B,K] f32, and for a model
    with a glance depth (depth, map [B,rows,cols] f32) from the same buffer. Without focal the model's
    default is used (a model without a focal input ignores it)."""

    def __init__(self, model: DepthPack, bucket: int, frame: dict | None = None):
        super().__init__(model, frame)
        self.bucket = bucket

    def forward(self, inputs: torch.Tensor, points: torch.Tensor, focal: torch.Tensor | None = None) -> torch.Tensor:
        images, points, focal = self.model_inputs(inputs, points, focal)
        if self.model.cfg.glance_depth:
            return self.model.packed_map_core(images, points, self.bucket, focal)
        return self.model.packed_core(images, points, self.bucket, focal)


class MapForward(_Forward):
    """The map-only package's function (a one-way model with a glance depth): PackedForward's inputs without
    the points -> map [B,rows,cols] f32, the one-way glance alone (DepthPack.glance_map_core)."""

    def forward(self, inputs: torch.Tensor, focal: torch.Tensor | None = None) -> torch.Tensor:
        images, _, focal = self.model_inputs(inputs, None, focal)
        return self.model.glance_map_core(images, focal)


def has_map_package(cfg: ModelConfig) -> bool:
    """Whether an export of this model writes the map-only package: a glance depth on the one-way stream."""
    return bool(cfg.glance_depth) and cfg.oneway


def package_label(bucket: int | None) -> str:
    return "the map-only package" if bucket is None else f"bucket {bucket}"


def forward_of(model: DepthPack, bucket: int | None, frame: dict | None = None) -> _Forward:
    """The function of bucket's package, or (bucket None) of the map-only package."""
    return MapForward(model, frame) if bucket is None else PackedForward(model, bucket, frame)


def manifest_focal(cfg: ModelConfig, frame: dict | None = None) -> dict | None:
    """The manifest's "focal" for this model (None: the packages take no focal input)."""
    if not cfg.uses_focal:
        return None
    return focal_entry(cfg.canonical_focal, cfg.focal_default or cfg.canonical_focal, tuple(cfg.img_size), frame)


def example_focal(cfg: ModelConfig, batch: int, g: torch.Generator, frame: dict | None = None) -> torch.Tensor:
    """focal [B] in pixels of the packages' input: one value away from the default (0.6x to 1.6x of it)
    for every row, one camera per batch as the C++ runner feeds it."""
    f = manifest_focal(cfg, frame)["default"] * (0.6 + torch.rand(1, generator=g))
    return f.expand(batch).contiguous()


def example_inputs(cfg: ModelConfig, batch: int, k: int | None, device, g: torch.Generator,
                   frame: dict | None = None) -> tuple[torch.Tensor, ...]:
    """Random images [B,3,H,W] in [0,1) (or uint8 frames [B,h,w,3]) and points [B,K,2] inside them,
    and for a model with a focal input a focal [B] (example_focal): the package's inputs in call
    order (k None: the map-only package's, no points). The last quarter of each row repeats the first
    point, like the runners' padding."""
    if frame is not None:
        h, w = frame["size"]
        inputs = torch.randint(0, 256, (batch, h, w, 3), generator=g, dtype=torch.uint8)
    else:
        h, w = cfg.img_size
        inputs = torch.rand(batch, 3, h, w, generator=g)
    points = () if k is None else (torch.rand(batch, k, 2, generator=g) * torch.tensor([w, h]) * (1 - 1e-6),)
    pad = (k or 0) // 4
    if pad:
        points[0][:, k - pad:] = points[0][:, :1]
    focal = (example_focal(cfg, batch, g, frame),) if cfg.uses_focal else ()
    return tuple(t.to(device) for t in (inputs, *points, *focal))


def static_graph_problems(ep: torch.export.ExportedProgram) -> list[str]:
    """What makes the exported graph data-dependent or dynamic (empty list: a static graph)."""
    problems = [f"range constraint on {s}" for s in ep.range_constraints]
    for node in ep.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target.__name__.split(".")[0] in FORBIDDEN_OPS:
                problems.append(f"data-dependent op {node.target} ({node.name})")
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not all(isinstance(s, int) for s in val.shape):
            problems.append(f"symbolic shape {tuple(val.shape)} at {node.name}")
    return problems


def export_program(model: DepthPack, k: int | None, batch: int, device, g: torch.Generator,
                   frame: dict | None = None) -> torch.export.ExportedProgram:
    """torch.export of bucket k's function (k None: the map-only package's), held to one static graph."""
    args = example_inputs(model.cfg, batch, k, device, g, frame)
    with torch.no_grad():
        ep = torch.export.export(forward_of(model, k, frame).eval(), args, strict=False)
    problems = static_graph_problems(ep)
    if problems:
        raise ExportError(f"{package_label(k)}: the packed forward is not one static graph: {'; '.join(problems[:5])}")
    return ep


# A package without its weights: compiled code whose constants a runner loads (contract.WEIGHTS).
# always_keep_tensor_constants: Inductor otherwise inlines small constants (a bias of one element,
# say) into the code, where new weights could never reach them.
WEIGHTS_OUTSIDE = {"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True}


def package_constants(forward: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of the exported module by the name the package gives its constant (the module's
    parameter and buffer FQNs), contiguous on the CPU, in the module's dtypes: the weights file."""
    named = [*forward.named_parameters(), *forward.named_buffers()]
    return {name: t.detach().to("cpu").contiguous() for name, t in named}


def check_constants(ep: torch.export.ExportedProgram, weights: dict[str, torch.Tensor], bucket: int | None) -> None:
    """Each constant of the program must be in the weights file with its shape and dtype: an ExportError
    names the first that is not (a lifted constant the module does not name, say)."""
    for name, t in {**ep.state_dict, **ep.constants}.items():
        if not isinstance(t, torch.Tensor):
            continue
        w = weights.get(name)
        if w is None or w.shape != t.shape or w.dtype != t.dtype:
            raise ExportError(f"{package_label(bucket)}: the program's constant {name} {t.dtype} {list(t.shape)} is not in the "
                              f"weights file as such ({'missing' if w is None else f'{w.dtype} {list(w.shape)}'})")


def constant_specs(ep: torch.export.ExportedProgram) -> dict[str, dict]:
    """{fqn: {"dtype", "shape"}} of every tensor constant of the program: what the package expects from
    the weights file, recorded in its metadata so both runners check a weights file before attaching it."""
    return {name: {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
            for name, t in sorted({**ep.state_dict, **ep.constants}.items()) if isinstance(t, torch.Tensor)}


def compile_package(ep: torch.export.ExportedProgram, path: Path, inductor_configs: dict | None = None,
                    metadata: dict[str, str] | None = None) -> Path:
    """AOTInductor-compile the program into the .pt2 at path, without its weights (WEIGHTS_OUTSIDE), with
    metadata (strings) stored in the package itself and the C++ runtime linked in, hidden
    (static_runtime_compiler). The exporter stages the whole folder and swaps it in at the end, so a
    half-written package is never under a folder a runner reads."""
    configs = {**WEIGHTS_OUTSIDE, **(inductor_configs or {})}
    if metadata:
        configs["aot_inductor.metadata"] = {**configs.get("aot_inductor.metadata", {}), **metadata}
    configs["cpp.cxx"] = (str(static_runtime_compiler()),)
    torch._inductor.aoti_compile_and_package(ep, package_path=str(path), inductor_configs=configs)
    return path


def compile_packages(jobs: list[dict], workers: int = 1, on_done=None) -> None:
    """Compile several exported programs into packages: jobs of compile_package's arguments ("ep", "path",
    "inductor_configs", "metadata"), in `workers` spawned processes at once (each program saved with
    torch.export.save and loaded there; AOTInductor's C++ compile of one package uses one core). A child
    that fails or dies (a full disk aborts the process that writes the package) is one ExportError naming
    the bucket, and this process lives on. on_done(job, seconds) as each finishes. Anything that ends the
    wait (a failed compile, a Ctrl-C, a SIGTERM) ends every child and its compilers at once (_end_workers):
    the pool's own shutdown would wait for the compiles under way."""
    import concurrent.futures as cf
    import multiprocessing as mp

    with process_temporary_dir("depthpack_eps_") as tmp:
        args = []
        for i, job in enumerate(jobs):
            ep_file = Path(tmp) / f"program_{i}.pt2"
            torch.export.save(job["ep"], str(ep_file))
            args.append({**{k: v for k, v in job.items() if k != "ep"}, "ep_file": str(ep_file)})
        log = Path(tmp) / "compile.log"  # the children's own output: a dying one prints a C++ stack there, not here
        pool = cf.ProcessPoolExecutor(max(1, min(workers, len(jobs))), mp_context=mp.get_context("spawn"),
                                      initializer=_child_setup, initargs=(str(log), os.getpid()))
        try:
            _wait_for(pool, args, jobs, on_done)
            pool.shutdown(wait=True)  # a Ctrl-C in this wait too ends the children: one that hangs would hold the exit
        except BaseException:
            _end_workers(pool)
            raise


def _wait_for(pool, args: list[dict], jobs: list[dict], on_done) -> None:
    import concurrent.futures as cf

    futures = {pool.submit(_compile_saved, a): job for a, job in zip(args, jobs)}
    for fut in cf.as_completed(futures):
        job = futures[fut]
        try:
            seconds = fut.result()
        except Exception as e:  # noqa: BLE001  (the child's error or its death, said in one line)
            raise ExportError(f"AOTInductor compile of {job['path'].name} failed: {_why(e, job['path'])}") from None
        if on_done:
            on_done(job, seconds)


def _end_workers(pool) -> None:
    """Kill the pool's children, each with its process group (the compilers it runs: _child_setup), then shut
    the pool down without waiting for their work. The pool has no kill of its own: its _processes."""
    import signal

    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:  # not (yet) a group of its own: the child alone
            proc.kill()
    pool.shutdown(wait=True, cancel_futures=True)


def _why(e: BaseException, path: Path) -> str:
    """What went wrong in a compile child, in words: a full disk where that is what it was."""
    import errno
    import shutil

    free = shutil.disk_usage(path.parent).free if path.parent.exists() else None
    text = f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]
    low = isinstance(e, (OSError, RuntimeError)) and free is not None and free < 64 << 20  # torch's zip writer: RuntimeError
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or low:
        return f"no space left on the device under {path.parent} ({(free or 0) >> 20} MiB free); {text}"
    return text


def _child_setup(log: str, parent: int) -> None:
    """A compile child dies with the exporter (die_with_parent), leads a process group of its own (so that
    _end_workers ends its compilers with it) and writes its output (progress, warnings, a dying C++
    runtime's stack) to log, its resource tracker's included: the exporter's tracker, which it would share,
    prints "leaked semaphore objects" onto the exporter's terminal after the one error line when a child
    dies holding one (a full disk aborts it)."""
    import sys
    from multiprocessing import resource_tracker

    die_with_parent(parent)
    os.setpgid(0, 0)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(fd, 1), os.dup2(fd, 2)
    os.close(fd)
    tracker = resource_tracker._resource_tracker  # the exporter's, inherited: forget it, and a tracker of this
    inherited = getattr(tracker, "_fd", None)  # child's own starts on first use, with the log as its stderr
    if inherited is not None:
        tracker._fd, tracker._pid = None, None
        os.close(inherited)


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """This process is killed (SIGKILL) when its parent `parent` dies, however it dies (SIGKILL and SIGTERM
    included): a compile child of a killed exporter would otherwise hold its memory under PID 1 forever.
    Linux's PR_SET_PDEATHSIG; elsewhere a thread that polls the parent. Gone already: exit now."""
    import ctypes
    import signal
    import threading
    import time

    try:
        armed = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no prctl: not Linux
        armed = False
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    if not armed:
        def watch():
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)
        threading.Thread(target=watch, daemon=True).start()


def _compile_saved(job: dict) -> float:
    import time

    from ..kernels import vit_block  # noqa: F401  (registers the depthpack ops a program may call)

    t0 = time.perf_counter()
    compile_package(torch.export.load(job["ep_file"]), Path(job["path"]), job.get("inductor_configs"), job.get("metadata"))
    return time.perf_counter() - t0


def static_runtime_compiler() -> Path:
    """A compiler wrapper that calls the host's g++ and, when it links a shared library, links
    libstdc++ and libgcc statically with their symbols hidden. Why: a process that loads the package
    may already hold another copy of C++ runtime symbols (torch 2.11's libtorch exports some), and a
    package bound half to one copy and half to the other crashes (docs/performance.md, "Tried and dropped").

    The wrapper lives at a path named by its content, in Inductor's cache folder, and is reused: Inductor
    keys its precompiled headers on the compiler's command line, so a new path per package would rebuild
    them for every package."""
    import hashlib
    import shutil

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from ..core.files import atomic_write_text

    real = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if real is None:
        raise ExportError("the export needs g++ on PATH (or $CXX) to compile the packages")
    text = ("#!/bin/sh\n# depthpack: the package's C++ runtime, linked in and hidden\n"
            'case " $* " in\n  *" -shared "*) exec ' + real
            + ' "$@" -static-libstdc++ -static-libgcc -Wl,--exclude-libs,ALL -Wl,-Bsymbolic ;;\n'
            "  *) exec " + real + ' "$@" ;;\nesac\n')
    folder = Path(cache_dir()) / "depthpack"
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / f"g++-static-runtime-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if not (wrapper.is_file() and wrapper.read_text() == text and os.access(wrapper, os.X_OK)):
        atomic_write_text(wrapper, text, mode=0o755)  # exports racing here write the same bytes
    return wrapper
