"""Export: one AOTInductor package per bucket, a manifest, a reference file, ONNX, a self-check.

    python -m depthpack.export --preset tiny --out /tmp/dp_tiny --buckets 8,64 --onnx
    python -m depthpack.export --checkpoint runs/vits --out /tmp/dp_export_vits --device cuda

The folder's contract is depthpack.deploy.contract. Steps (a failure at any step is one ExportError):
  1. refuse targets this process cannot build for (a .pt2 holds native code for one CPU architecture
     and one GPU compute capability: build it where it runs), and an --out that holds anything but
     an earlier export;
  2. in a staging folder beside --out: per bucket torch.export -> static-graph check -> AOTInductor
     with the fast recipe for the device and batch (core.fast; --recipe reference: the plain model) (the
     packages hold code; the weights go to one file beside them, contract.WEIGHTS), or, with
     reuse_packages, an earlier export's packages of the same model and build, copied: new weights
     in minutes-old packages, no compile; the weights file, the reference files, optionally ONNX,
     the manifest;
  3. the self-check in a child process (depthpack.deploy.selfcheck);
  4. only then the staging folder is swapped in for --out (core.files.publish_dir): a failed or
     killed export leaves the previous export in --out complete and usable.
"""
from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.checkpoint import load_model
from ..core.config import PRESETS, ModelConfig, model_config, stored_model_config, to_dict
from ..core.fast import Recipe, resolve
from ..core.files import atomic_write_bytes, atomic_write_json, publish_dir, publish_into, sha256_file, staging_dir
from ..core.model import DepthPack, create_model, random_weights_
from .contract import (DTYPES, FORMAT, FRAME_FORMATS, MANIFEST, MAP_BUCKET, MAP_PACKAGE, MAP_PACKAGE_KEYS, PACKAGE_BUCKET,
                       PACKAGE_CONSTANTS, PACKAGE_INPUTS, PREPROCESS, REFERENCE, REFERENCE_IMAGE, REFERENCE_POINTS,
                       TOLERANCE, WEIGHTS, io_specs, map_package, map_specs, onnx_name, package_name, read_manifest,
                       verify_file)
from .onnx import export_onnx
from .package import (ExportError, PackedForward, check_constants, compile_packages, constant_specs, export_program,
                      has_map_package, manifest_focal, package_constants, package_label)
from .reference import write_reference
from .selfcheck import finish_self_check, start_self_check

# named targets -> (CPU architecture, CUDA compute capability or None)
TARGETS = {"jetson-orin": ("aarch64", "8.7"), "jetson-xavier": ("aarch64", "7.2"),
           "h100": ("x86_64", "9.0"), "h200": ("x86_64", "9.0")}


@dataclass
class ExportOptions:
    out: str
    device: str = "cpu"  # cpu | cuda | cuda:N
    dtype: str | None = None  # compute dtype inside the package; None: bfloat16 on CUDA with the fast recipe, else float32
    buckets: tuple[int, ...] | None = None  # None: the model config's ladder
    batch: int = 1
    recipe: str = "fast"  # "fast": the fast recipe for the device and batch (core.fast); "reference": the plain model
    onnx: bool = False
    onnx_buckets: tuple[int, ...] | None = None  # None: every exported bucket (with onnx)
    reuse_packages: str | None = None  # an earlier export of the same model and build: its packages, new weights
    compile_workers: int | None = None  # packages compiled at once (None: one per 4 cores, at most one per bucket)
    frame_size: tuple[int, int] | None = None  # (h, w): packages take uint8 camera frames of this size
    frame_format: str = "bgr8"  # with frame_size: the frames' channel order (bgr8 from OpenCV, or rgb8)
    target: str = "native"  # or a name in TARGETS, or "ARCH[:sm_XY]"
    seed: int = 0
    check_timeout_s: int = 900

    def recipe_for(self, device: torch.device) -> Recipe:
        return resolve(self.recipe, device, self.batch)

    def compute_dtype(self, device: torch.device) -> str:
        return self.dtype or ("bfloat16" if self.recipe == "fast" and device.type == "cuda" else "float32")


# ---- model ----------------------------------------------------------------------------------------
def preset_of(cfg: ModelConfig) -> str | None:
    """The preset whose config this is (ignoring the bucket ladder and the backbone file), else None."""
    def key(c: ModelConfig) -> dict:
        d = to_dict(c)
        d.pop("buckets"), d.pop("backbone_weights")
        return d
    return next((name for name in PRESETS if key(model_config(name)) == key(cfg)), None)


def load_for_export(checkpoint: str | None = None, preset: str | None = None, seed: int = 0,
                    overrides: dict | None = None) -> tuple[DepthPack, str | None]:
    """(float32 CPU model in eval mode, preset name or None). A checkpoint is rebuilt from its stored
    config and safetensors weights (nothing is unpickled); a preset gets seeded random weights, its
    config changed by overrides first (e.g. {"canonical_focal": 48.0}: a model with a focal input)."""
    if (checkpoint is None) == (preset is None):
        raise ExportError("give exactly one of --checkpoint CKPT or --preset NAME")
    if overrides and preset is None:
        raise ExportError("--model overrides a preset's config; a checkpoint's config belongs to its weights")
    if preset is not None:
        if preset not in PRESETS:
            raise ExportError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        cfg = model_config(preset, **{**(overrides or {}), "backbone_weights": None})
        model = random_weights_(create_model(cfg), seed)
        return model.eval(), preset_of(cfg) if overrides else preset
    if not Path(checkpoint).exists():
        raise ExportError(f"checkpoint {checkpoint}: no such file or folder")
    model = load_model(checkpoint)
    return model.float().cpu().eval(), preset_of(model.cfg)


# ---- checks on the request ------------------------------------------------------------------------
def parse_target(target: str) -> tuple[str, str | None] | None:
    """None for 'native'; (arch, compute capability or None) for a name or 'ARCH[:sm_XY]'."""
    if target in ("native", "", None):
        return None
    if target in TARGETS:
        return TARGETS[target]
    arch, _, sm = target.partition(":")
    if arch not in ("x86_64", "aarch64") or (sm and not (sm.startswith("sm_") and sm[3:].isdigit() and len(sm) >= 5)):
        raise ExportError(f"unknown target {target!r}: use native, one of {sorted(TARGETS)}, or ARCH[:sm_XY] "
                          f"with ARCH x86_64 or aarch64 (e.g. aarch64:sm_87)")
    return arch, (f"{sm[3:-1]}.{sm[-1]}" if sm else None)


def resolve_device(device: str, target: str = "native") -> torch.device:
    """The device to build for, or an ExportError when this process cannot build for it: AOTInductor
    compiles for the CPU it runs on and the GPU it sees, so a package is built where it will run."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ExportError(f"--device {device!r}: use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ExportError(f"--device {device!r}: use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ExportError(f"--device {device}: CUDA is not available on this machine (torch {torch.__version__}); "
                              f"a CUDA package must be built on a machine with the GPU that will run it")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ExportError(f"--device {device}: only {torch.cuda.device_count()} GPU(s) visible")
    wanted = parse_target(target)
    if wanted is not None:
        arch, cc = wanted
        here = platform.machine()
        if arch != here:
            raise ExportError(f"cannot build for target {target} ({arch}{', sm_' + cc.replace('.', '') if cc else ''}) "
                              f"on this {here} machine: a .pt2 holds native code for the CPU it was built on; "
                              f"export on the target itself (deploy_cpp/README.md), or use --onnx and TensorRT there")
        if cc is not None:
            if dev.type != "cuda":
                raise ExportError(f"target {target} is a GPU (sm_{cc.replace('.', '')}): add --device cuda")
            have = "{}.{}".format(*torch.cuda.get_device_capability(dev))
            if have != cc:
                raise ExportError(f"cannot build for target {target} (sm_{cc.replace('.', '')}) on this GPU "
                                  f"(sm_{have.replace('.', '')}): export on a GPU of the target's compute capability")
    return dev


def check_buckets(buckets, cfg: ModelConfig) -> tuple[int, ...]:
    buckets = tuple(int(b) for b in buckets)
    if not buckets:
        raise ExportError("--buckets: give at least one capacity")
    if any(b < 1 for b in buckets):
        raise ExportError(f"--buckets {list(buckets)}: capacities must be positive")
    if any(a >= b for a, b in zip(buckets, buckets[1:])):
        raise ExportError(f"--buckets {list(buckets)}: capacities must be strictly ascending")
    if buckets[-1] > cfg.num_patches:
        raise ExportError(f"--buckets {list(buckets)}: {buckets[-1]} is more than the {cfg.num_patches} patches of a "
                          f"{cfg.img_size[0]}x{cfg.img_size[1]} image (patch {cfg.patch_size})")
    return buckets


def check_out_dir(out: Path) -> None:
    """--out must be new, empty, or a folder an earlier export wrote (it will be replaced whole), and the
    export must be able to put its result there: checked now, before minutes of compiling."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise ExportError(f"--out {out} lies under the file {parent}")
    # the folder the result is staged in: --out itself where it is a mount point (filled in place), else beside it
    where = out if out.is_dir() and os.path.ismount(out) else next(p for p in out.parents if p.exists())
    if not os.access(where, os.W_OK | os.X_OK):
        raise ExportError(f"--out {out}: {where} is not writable" + (" (a read-only mount point)" if where == out else ""))
    if out.is_dir() and where != out and not os.access(out, os.W_OK | os.X_OK):
        raise ExportError(f"--out {out} is not writable, so it cannot be replaced")
    if not out.is_dir():
        return
    names = {p.name for p in out.iterdir()}
    ours = {MANIFEST, REFERENCE, REFERENCE_IMAGE, REFERENCE_POINTS, WEIGHTS, MAP_PACKAGE, ".tmp_packages",
            ".manifest.unchecked.json"}
    foreign = sorted(n for n in names if n not in ours and not n.startswith((".selfcheck_", ".staging-"))
                     and not (n.startswith("depthpack_k") and n.endswith((".pt2", ".onnx"))))
    if foreign and MANIFEST not in names:
        raise ExportError(f"--out {out} holds files that are not a depthpack export ({', '.join(foreign[:5])}); "
                          f"the export replaces the whole folder: choose a new or empty one")
    if foreign:
        raise ExportError(f"--out {out} holds an export and other files ({', '.join(foreign[:5])}); the export "
                          f"replaces the whole folder: move them out first")


def frame_of(opts: ExportOptions) -> dict | None:
    """The manifest's "frame" for these options (None: packages take float images)."""
    if opts.frame_size is None:
        return None
    if opts.frame_format not in FRAME_FORMATS:
        raise ExportError(f"--frame-format {opts.frame_format!r}: choose one of {sorted(FRAME_FORMATS)}")
    h, w = (int(v) for v in opts.frame_size)
    if h < 1 or w < 1:
        raise ExportError(f"--frame-size: need a positive size, got {w}x{h} (WxH)")
    return {"size": [h, w], "color": FRAME_FORMATS[opts.frame_format]}


def build_manifest(cfg: ModelConfig, preset, opts: ExportOptions, device: torch.device, buckets, bucket_entries,
                   reference: dict, onnx_entries: list, weights: dict | None = None, map_entry: dict | None = None) -> dict:
    """The manifest (contract.FORMAT); map_entry: the map-only package's MAP_PACKAGE_KEYS, beside the map's size."""
    dtype = opts.compute_dtype(device)
    mcfg = to_dict(cfg)
    mcfg["buckets"] = list(buckets)
    mcfg["backbone_weights"] = None
    manifest = {
        "format": FORMAT, "preset": preset, "model_config": mcfg,
        "image_size": list(cfg.img_size), "patch_size": cfg.patch_size, "batch_size": opts.batch,
        "device": device.type,
        "compute_capability": "{}.{}".format(*torch.cuda.get_device_capability(device)) if device.type == "cuda" else None,
        "arch": platform.machine(), "dtype": dtype, "torch_version": torch.__version__,
        "min_depth": cfg.min_depth, "max_depth": cfg.max_depth, "frame": frame_of(opts),
        **({"focal": manifest_focal(cfg, frame_of(opts))} if cfg.uses_focal else {}),
        **({"map": {"size": list(cfg.glance_map_size), **(map_entry or {})}} if cfg.glance_depth else {}),
        "preprocess": dict(PREPROCESS), "tolerance": dict(TOLERANCE[dtype]),
        "buckets": sorted(bucket_entries, key=lambda b: b["bucket"]),
        "build": {"recipe": {**opts.recipe_for(device).kernels, "inductor": opts.recipe_for(device).inductor_options()}},
    }
    if onnx_entries:
        manifest["onnx"] = [{k: e[k] for k in ("bucket", "file", "sha256")} for e in onnx_entries]
    manifest["reference"] = reference
    manifest["weights"] = weights
    return manifest


# what must agree between an earlier export and this one for its packages to take this model's weights
REUSE_KEYS = ("model_config", "image_size", "patch_size", "batch_size", "device", "compute_capability", "arch",
              "dtype", "torch_version", "frame", "focal", "preprocess", "build")


def reusable_packages(old: Path, new: dict) -> dict:
    """The manifest of the earlier export at old, once its packages are known to fit the manifest new
    would have (REUSE_KEYS: the same model config, buckets, device, dtype, torch, inputs and build) and
    to keep their weights outside; an ExportError names the first difference."""
    try:
        m = read_manifest(old / MANIFEST)
    except ValueError as e:
        raise ExportError(f"--reuse-packages {old}: {e}") from None
    if m["weights"] is None:
        raise ExportError(f"--reuse-packages {old}: its packages hold their weights (an older export layout); "
                          f"export without --reuse-packages")
    for key in REUSE_KEYS:
        a, b = (m.get(key), new.get(key)) if key != "model_config" else (_as_stored(m[key]), _as_stored(new[key]))
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):  # name the inner key: model_config.depth, say
                inner = next(k for k in [*a, *b] if a.get(k) != b.get(k))
                key, a, b = f"{key}.{inner}", a.get(inner), b.get(inner)
            raise ExportError(f"--reuse-packages {old}: its {key} is {json.dumps(a)[:200]}, this export's is "
                              f"{json.dumps(b)[:200]}: its packages are not this model's; export without "
                              f"--reuse-packages")
    return m


def _as_stored(model_cfg) -> dict:
    """A manifest's model_config with what its packages ran where a field is absent (stored_model_config)."""
    try:
        return to_dict(stored_model_config(model_cfg))
    except (ValueError, TypeError):
        return model_cfg  # refused by the comparison, naming the field


def export(model: DepthPack, opts: ExportOptions, preset: str | None = None, log=print) -> dict:
    """Build the folder opts.out from a float32 CPU model; returns a summary with measured times.
    Raises ExportError (a ValueError) on any refusal or failed check; opts.out is then untouched."""
    if opts.dtype is not None and opts.dtype not in DTYPES:
        raise ExportError(f"--dtype {opts.dtype!r}: choose one of {sorted(DTYPES)}")
    if opts.batch < 1:
        raise ExportError(f"--batch {opts.batch}: must be >= 1")
    resolve(opts.recipe, "cpu")  # "fast", "reference" or a Recipe: anything else is refused here
    if opts.compile_workers is not None and opts.compile_workers < 1:
        raise ExportError(f"--compile-workers {opts.compile_workers}: must be >= 1")
    device = resolve_device(opts.device, opts.target)
    buckets = check_buckets(opts.buckets or model.cfg.buckets, model.cfg)
    onnx_buckets = tuple(opts.onnx_buckets or buckets) if opts.onnx else ()
    if set(onnx_buckets) - set(buckets):
        raise ExportError(f"--onnx-buckets {list(onnx_buckets)}: each must be one of the exported buckets {list(buckets)}")
    frame_of(opts)  # a bad frame size or format is refused before anything is built
    out = Path(opts.out)
    check_out_dir(out)
    reused = None
    if opts.reuse_packages:  # refused now, before anything is built, when the packages do not fit
        reused = reusable_packages(Path(opts.reuse_packages), build_manifest(model.cfg, preset, opts, device, buckets,
                                                                             [], {}, []))
    inplace = out.is_dir() and os.path.ismount(out)  # a mount point cannot be swapped: filled in place
    staged = out / f".staging-{os.getpid()}" if inplace else staging_dir(out)
    staged.mkdir(exist_ok=True)
    try:
        summary = _build(model, opts, preset, device, buckets, onnx_buckets, staged, log, reused)
        publish_into(staged, out, MANIFEST) if inplace else publish_dir(staged, out)
    except Exception as e:
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        free = shutil.disk_usage(staged).free if staged.exists() else None
        shutil.rmtree(staged, ignore_errors=True)
        # torch's zip writer reports a full disk as a RuntimeError; a bug (NameError, ...) is never blamed on the disk
        if full or (isinstance(e, (OSError, RuntimeError)) and free is not None and free < 64 << 20):
            raise ExportError(f"no space left on the device under {staged.parent} ({(free or 0) >> 20} MiB free): "
                              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; the previous export "
                              f"(if any) is untouched") from None
        raise
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    summary.update(out=str(out), manifest=str(out / MANIFEST))
    return summary


def _build(model: DepthPack, opts: ExportOptions, preset, device, buckets, onnx_buckets, out: Path, log,
           reused: dict | None = None) -> dict:
    recipe = opts.recipe_for(device)
    deployed = model.deployed(recipe, device, DTYPES[opts.compute_dtype(device)])
    frame = frame_of(opts)
    g = torch.Generator().manual_seed(opts.seed)
    weights = package_constants(PackedForward(deployed, buckets[0], frame))
    times: dict = {"export_s": {}, "compile_s": {}}
    t_all = time.perf_counter()
    inductor_configs = recipe.inductor_options()
    if reused is not None:  # the same build (reusable_packages): these settings are the packages' own
        entries, map_entry = _copy_packages(Path(opts.reuse_packages), reused, out, log)
    else:
        entries, map_entry = _compile(deployed, opts, device, buckets, frame, g, weights, inductor_configs, out, times,
                                      log)
    from safetensors.torch import save

    atomic_write_bytes(out / WEIGHTS, save(weights))  # the umask's mode, readable by a robot's service user
    weights_entry = {"file": WEIGHTS, "sha256": sha256_file(out / WEIGHTS)}
    log(f"weights: {len(weights)} tensors, {(out / WEIGHTS).stat().st_size / 1e6:.1f} MB -> {WEIGHTS}")
    reference = write_reference(deployed, buckets, out, opts.batch, opts.seed, device, frame)
    # the manifest of the packages, checked by a child process while the ONNX files are exported here;
    # then written again with the ONNX entries (the folder is staged: a runner sees only the final one)
    atomic_write_json(out / MANIFEST, build_manifest(model.cfg, preset, opts, device, buckets, entries, reference, [],
                                                     weights_entry, map_entry), sort_keys=False)
    t0 = time.perf_counter()
    log("self-check: loading the packages in a child process (python -m depthpack.runtime.aoti --check)"
        + (", beside the ONNX export" if onnx_buckets else ""))
    pending = start_self_check(deployed, out / MANIFEST, buckets, opts.batch, device, g, opts.check_timeout_s, frame)
    onnx_entries = []
    for k in onnx_buckets:
        t1 = time.perf_counter()
        e = export_onnx(model, k, opts.batch, out / onnx_name(k), g, frame)
        times.setdefault("onnx_s", {})[k] = round(time.perf_counter() - t1, 2)
        log(f"ONNX bucket {k}: {e['exporter']} exporter, onnxruntime vs eager max |diff| {e['max_abs_diff']:.2e} m")
        onnx_entries.append(e)
    report = finish_self_check(pending)
    times["check_s"] = round(time.perf_counter() - t0, 2)  # with the ONNX export beside it
    if onnx_entries:
        manifest = build_manifest(model.cfg, preset, opts, device, buckets, entries, reference, onnx_entries, weights_entry,
                                  map_entry)
        atomic_write_json(out / MANIFEST, manifest, sort_keys=False)
    times["total_s"] = round(time.perf_counter() - t_all, 2)
    log(f"self-check ok ({report['checker']}): fresh inputs {report['buckets']}, reference {report['reference']}")
    check = {k: report[k] for k in ("checker", "buckets", "reference", "load_s", "python_loader") if k in report}
    return {"device": str(device), "dtype": opts.compute_dtype(device), "buckets": list(buckets), "torch": torch.__version__,
            "times": times, "check": check, "recipe": recipe.describe(),
            "onnx": [{k: e[k] for k in ("bucket", "exporter", "max_abs_diff")} for e in onnx_entries]}


def specs_of(cfg: ModelConfig, batch: int, k: int | None, frame: dict | None) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of bucket k's package, or (k None) of the map-only package."""
    dmap = cfg.glance_map_size if cfg.glance_depth else None
    if k is None:
        return map_specs(cfg.img_size, batch, frame, cfg.uses_focal, dmap)
    return io_specs(cfg.img_size, batch, k, frame, cfg.uses_focal, dmap)


def _compile(deployed: DepthPack, opts: ExportOptions, device, buckets, frame, g, weights, inductor_configs: dict,
             out: Path, times: dict, log) -> tuple[list[dict], dict | None]:
    """Per bucket, and for the map-only package (has_map_package): torch.export, the static-graph check,
    AOTInductor; (the buckets' manifest entries, the map-only package's or None)."""
    entries, jobs = [], []
    ks = [*buckets, *([None] if has_map_package(deployed.cfg) else [])]
    for k in tqdm(ks, desc=f"torch.export {device.type} {opts.compute_dtype(device)}", unit="package", file=sys.stderr):
        t0 = time.perf_counter()
        ep = export_program(deployed, k, opts.batch, device, g, frame)
        check_constants(ep, weights, k)
        times["export_s"][k or MAP_BUCKET] = round(time.perf_counter() - t0, 2)
        inputs, outputs = specs_of(deployed.cfg, opts.batch, k, frame)
        path = out / (MAP_PACKAGE if k is None else package_name(k))
        metadata = {PACKAGE_BUCKET: str(k or MAP_BUCKET), PACKAGE_INPUTS: json.dumps(inputs, separators=(",", ":")),
                    PACKAGE_CONSTANTS: json.dumps(constant_specs(ep), separators=(",", ":"))}
        jobs.append({"ep": ep, "path": path, "inductor_configs": inductor_configs, "k": k, "metadata": metadata})
        entries.append({"bucket": k, "file": path.name, "inputs": inputs, "outputs": outputs})
    workers = opts.compile_workers if opts.compile_workers is not None else max(1, min(len(jobs), (os.cpu_count() or 1) // 4))
    bar = tqdm(total=len(jobs), desc=f"AOTInductor {device.type} {opts.compute_dtype(device)} ({workers} at once)", unit="package",
               file=sys.stderr)

    def done(job, seconds):
        times["compile_s"][job["k"] or MAP_BUCKET] = round(seconds, 2)
        log(f"{package_label(job['k'])}: AOTInductor compile {seconds:.1f} s -> {job['path'].name}")
        bar.update(1)
    try:
        compile_packages(jobs, workers, done)
    finally:
        bar.close()
    for e in entries:
        e["sha256"] = sha256_file(out / e["file"])
    return ([{k: e[k] for k in ("bucket", "file", "sha256", "inputs", "outputs")} for e in entries if e["bucket"]],
            next(({k: e[k] for k in MAP_PACKAGE_KEYS} for e in entries if e["bucket"] is None), None))


def _copy_packages(old: Path, manifest: dict, out: Path, log) -> tuple[list[dict], dict | None]:
    """The earlier export's packages (the map-only package too), each checked against its manifest's sha256,
    copied into out; (the buckets' entries, the map-only package's or None)."""
    mapped = map_package(manifest)
    entries = [*manifest["buckets"], *([mapped] if mapped else [])]
    for b in entries:
        try:
            verify_file(old / b["file"], b["sha256"], "package")
        except ValueError as e:
            raise ExportError(f"--reuse-packages {old}: {e}") from None
        shutil.copyfile(old / b["file"], out / b["file"])
    log(f"packages of {old} reused ({', '.join(b['file'] for b in entries)}): no compile")
    return [dict(b) for b in manifest["buckets"]], ({k: mapped[k] for k in MAP_PACKAGE_KEYS} if mapped else None)
