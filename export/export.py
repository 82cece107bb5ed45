#!/usr/bin/env python
"""Export DepthPack to AOTInductor packages (+ manifest, reference, optional ONNX): a thin CLI over
depthpack.deploy.export. Any refusal or failed check is one line on stderr and exit code 1.

    python export/export.py --preset tiny --out /tmp/dp_tiny --buckets 8,64 --onnx
    python export/export.py --checkpoint runs/vits --out /tmp/dp_export_vits --device cuda --dtype bfloat16
    python export/export.py --checkpoint runs/vits --out out/cam --device cuda --frame-size 640x480 --frame-format bgr8
    python export/export.py --checkpoint runs/vits2 --out out/v2 --device cuda --dtype bfloat16 --reuse-packages out/v1
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from depthpack.core import cli  # noqa: E402
from depthpack.core.preprocess import parse_frame_size  # noqa: E402
from depthpack.deploy.contract import DTYPES, FRAME_FORMATS  # noqa: E402
from depthpack.deploy.export import TARGETS, ExportOptions, export, load_for_export  # noqa: E402


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _settings(text: str) -> dict:
    """'a=1,b.c=true' -> {"a": 1, "b.c": True} (values read as YAML scalars)."""
    import yaml

    out = {}
    for item in (t for t in text.split(",") if t.strip()):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise argparse.ArgumentTypeError(f"{item!r} is not key=value")
        out[key.strip()] = yaml.safe_load(value)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = cli.Parser(description=__doc__.split("\n\n")[0], name="export")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="run folder, checkpoint folder or model.safetensors (config.json beside it)")
    src.add_argument("--preset", help="export a preset with seeded random weights (for tests)")
    ap.add_argument("--out", required=True, help="output folder (manifest.json, depthpack_k{K}.pt2, reference.*)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: the device the packages will run on")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="compute dtype inside the packages")
    ap.add_argument("--buckets", type=_ints, default=None, help="capacities, ascending (default: the model config's)")
    ap.add_argument("--batch", type=int, default=1, help="static batch size of the packages")
    ap.add_argument("--onnx", action="store_true", help="also write float32 ONNX models (opset 20), checked with onnxruntime")
    ap.add_argument("--onnx-buckets", type=_ints, default=None, help="ONNX only for these buckets (default: all)")
    ap.add_argument("--max-autotune", action="store_true", help="Inductor max-autotune (much slower compile)")
    ap.add_argument("--switches", type=_settings, default=None, metavar="K=V,...",
                    help="the model's fast paths in the packages, e.g. selection=count,mlp_epilogue=true")
    ap.add_argument("--inductor", type=_settings, default=None, metavar="K=V,...",
                    help="Inductor settings for AOTInductor, e.g. combo_kernels=true,triton.enable_pdl=true "
                         "(settings a target's GPU lacks, such as PDL before Hopper, are left out and said so)")
    ap.add_argument("--target", default="native",
                    help=f"refuse unless this machine is the target: native, {', '.join(sorted(TARGETS))} or ARCH[:sm_XY]")
    ap.add_argument("--dynamic-cxx-runtime", action="store_true",
                    help="link the packages against the process's C++ runtime instead of carrying their own "
                         "(which keeps them loadable where another library exports C++ runtime symbols)")
    ap.add_argument("--weights-in-packages", action="store_true",
                    help="compile the weights into each package (the older layout) instead of one weights file "
                         "beside weight-free packages")
    ap.add_argument("--reuse-packages", default=None, metavar="DIR",
                    help="take the packages of the earlier export DIR (the same model config, buckets, device, dtype, "
                         "torch and build; refused otherwise) and give them this checkpoint's weights: no compile")
    ap.add_argument("--frame-size", type=parse_frame_size, default=None, metavar="WxH",
                    help="packages take uint8 camera frames of this size (e.g. 640x480) and preprocess inside "
                         "(resize, channel order, scale); default: float images at the model's size")
    ap.add_argument("--frame-format", default="bgr8", choices=sorted(FRAME_FORMATS),
                    help="with --frame-size: the frames' channel order (bgr8: OpenCV and most drivers)")
    ap.add_argument("--compile-workers", type=int, default=None, metavar="N",
                    help="packages compiled at once, each in its own process (default: one per 4 cores, at most "
                         "one per bucket; 1: all in this process, which pays Inductor's start-up once)")
    ap.add_argument("--seed", type=int, default=0, help="seed of preset weights, reference and check inputs")
    ap.add_argument("--model", type=_settings, default=None, metavar="K=V,...",
                    help="with --preset: model config overrides, e.g. canonical_focal=48 (a focal input)")
    ap.add_argument("--cpp-runner", default=None,
                    help="deploy_cpp's depthpack_run, for the self-check where loading packages kills Python "
                         "(torch 2.11 + CUDA); default: $DEPTHPACK_RUN or deploy_cpp/build")
    return ap.parse_args(argv)


def _main(argv=None) -> int:
    args = parse_args(argv)
    model, preset = load_for_export(args.checkpoint, args.preset, args.seed, args.model)
    opts = ExportOptions(out=args.out, device=args.device, dtype=args.dtype, buckets=args.buckets,
                         batch=args.batch, onnx=args.onnx or bool(args.onnx_buckets),
                         onnx_buckets=args.onnx_buckets, max_autotune=args.max_autotune,
                         target=args.target, seed=args.seed, cpp_runner=args.cpp_runner,
                         frame_size=args.frame_size, frame_format=args.frame_format,
                         switches=args.switches, inductor_configs=args.inductor,
                         static_cxx_runtime=not args.dynamic_cxx_runtime, compile_workers=args.compile_workers,
                         weights_outside=not args.weights_in_packages, reuse_packages=args.reuse_packages)
    summary = export(model, opts, preset, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(summary))
    return 0


def main(argv=None) -> int:
    """ExportError, CheckpointError, config errors (ValueErrors that say what is wrong): one line, exit 1."""
    return cli.run("export", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
