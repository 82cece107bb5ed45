"""python -m depthpack.export (and export/export.py): the export's command line over depthpack.deploy.build.
Any refusal or failed check is one line on stderr and exit code 1."""
from __future__ import annotations

import argparse
import json
import sys

from ..core import cli
from ..core.fast import RECIPES
from ..core.preprocess import parse_frame_size
from .contract import DTYPES, FRAME_FORMATS
from .build import TARGETS, ExportOptions, export, load_for_export


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
    ap = cli.Parser(prog="python -m depthpack.export", description=__doc__.split("\n")[0], name="export")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="run folder, checkpoint folder, or a weights file of any name (that file, config.json beside it)")
    src.add_argument("--preset", help="export a preset with seeded random weights (for tests)")
    ap.add_argument("--out", required=True, help="output folder (manifest.json, depthpack_k{K}.pt2, reference.*)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: the device the packages will run on")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                    help="compute dtype inside the packages (default: bfloat16 on CUDA with the fast recipe, else float32)")
    ap.add_argument("--buckets", type=_ints, default=None, help="capacities, ascending (default: the model config's)")
    ap.add_argument("--batch", type=int, default=1, help="static batch size of the packages")
    ap.add_argument("--onnx", action="store_true", help="also write float32 ONNX models (opset 20), checked with onnxruntime")
    ap.add_argument("--onnx-buckets", type=_ints, default=None, help="ONNX only for these buckets (default: all)")
    ap.add_argument("--recipe", default="fast", choices=RECIPES,
                    help="fast: the fastest measured recipe for the device and batch (core.fast); reference: the plain "
                         "model, for debugging and as a reference")
    ap.add_argument("--target", default="native",
                    help=f"refuse unless this machine is the target: native, {', '.join(sorted(TARGETS))} or ARCH[:sm_XY]")
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
                         "one per bucket)")
    ap.add_argument("--seed", type=int, default=0, help="seed of preset weights, reference and check inputs")
    ap.add_argument("--model", type=_settings, default=None, metavar="K=V,...",
                    help="with --preset: model config overrides, e.g. canonical_focal=48 (a focal input)")
    return ap.parse_args(argv)


def _main(argv=None) -> int:
    args = parse_args(argv)
    model, preset = load_for_export(args.checkpoint, args.preset, args.seed, args.model)
    opts = ExportOptions(out=args.out, device=args.device, dtype=args.dtype, buckets=args.buckets,
                         batch=args.batch, recipe=args.recipe, onnx=args.onnx or bool(args.onnx_buckets),
                         onnx_buckets=args.onnx_buckets, target=args.target, seed=args.seed,
                         frame_size=args.frame_size, frame_format=args.frame_format,
                         compile_workers=args.compile_workers, reuse_packages=args.reuse_packages)
    summary = export(model, opts, preset, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(summary))
    return 0


def main(argv=None) -> int:
    """ExportError, CheckpointError, config errors (ValueErrors that say what is wrong): one line, exit 1."""
    return cli.run("export", _main, argv, sigterm=True)

