"""python -m depthpack.data: a figure of synthetic scenes, or synthetic samples written to disk in the
generic folder format (rgb/NAME.png + depth/NAME.png). The renderer's speed: scripts/render_bench.py."""
import sys
from pathlib import Path

from ..core import cli


def parse_args(argv: list[str] | None = None):
    ap = cli.Parser(prog="python -m depthpack.data", description=__doc__.splitlines()[0], name="data")
    ap.add_argument("--size", type=int, nargs=2, default=None, metavar=("H", "W"),
                    help="the scenes' size (default: 256 256 for --write, 420 560 for --figure)")
    ap.add_argument("--figure", default=None, help="write a PNG of sample scenes here (the thin band in red)")
    ap.add_argument("--thin-width-ref", type=int, default=560, metavar="PX",
                    help="the image width at which thin structures and small objects are 1-4 px (data.thin_width_ref)")
    ap.add_argument("--thin-structures", type=float, default=1.5, metavar="N",
                    help="mean count per scene of thin structures (data.thin_structures)")
    ap.add_argument("--distant-objects", type=float, default=1.0, metavar="N",
                    help="mean count per scene of small distant objects (data.distant_objects)")
    ap.add_argument("--fences", type=float, default=0.0, metavar="N",
                    help="mean count per scene of fences facing the camera (data.fences)")
    ap.add_argument("--band-radius", type=int, default=14, metavar="PX",
                    help="the figure's depth-edge band radius (default 14: one vits patch)")
    ap.add_argument("--write", default=None, metavar="DIR", help="write --count synthetic samples here")
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--scene", default="mixed", choices=("indoor", "outdoor", "mixed"))
    ap.add_argument("--depth-scale", type=float, default=256.0, help="uint16 per meter (256 keeps 0-255 m)")
    args = ap.parse_args(argv)
    if not (args.write or args.figure):
        ap.error("nothing to do: give --figure PNG and/or --write DIR")
    if args.figure and not Path(args.figure).resolve().parent.is_dir():  # before seconds of rendering
        ap.error(f"--figure {args.figure}: the folder {Path(args.figure).parent} does not exist")
    if args.thin_width_ref <= 0 or args.band_radius < 0 or (args.size is not None and min(args.size) < 1):
        ap.error("--thin-width-ref and --size must be positive pixel counts, --band-radius >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Errors are one line (cli.run): a bad argument, a folder that is not there, a file system that refuses."""
    from . import DataConfig, make_dataset, write_folder_sample  # torch: inside cli.run, a Ctrl-C in it too
    from .synthetic import figure

    args = parse_args(argv)
    cfg = DataConfig(scene=args.scene, num_samples=args.count, thin_width_ref=args.thin_width_ref,
                     thin_structures=args.thin_structures, distant_objects=args.distant_objects,
                     fences=args.fences)  # bad counts: one line
    if args.write:
        from tqdm import tqdm

        ds = make_dataset(cfg, "train", tuple(args.size or (256, 256)), 1e-3, 250.0)
        for i in tqdm(range(args.count), desc="writing"):
            write_folder_sample(ds[i], args.write, f"{i:06d}", args.depth_scale)
        print(f"wrote {args.count} samples to {args.write} (read with DataConfig(kind='folder', root=..., "
              f"depth_scale={args.depth_scale}))")
    if args.figure:
        figure(args.figure, size=tuple(args.size or (420, 560)), families=cfg.families(), radius=args.band_radius)
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run("data", main))
