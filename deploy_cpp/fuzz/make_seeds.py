"""Seeds of the fuzz targets from real exports (the committed corpus/<target>/seed_* files).

    .venv/bin/python deploy_cpp/fuzz/make_seeds.py EXPORT_IMAGES EXPORT_FRAMES EXPORT_MAP [EXPORT_ONEWAY]

EXPORT_IMAGES, EXPORT_FRAMES, EXPORT_MAP: folders written by export/export.py --preset tiny (the second
with --frame-size 96x80 --frame-format bgr8, the third with --model context=glance,glance_grid=4,
glance_depth=true,query_head=residual: packages with a map). Writes, for each target, files named seed_*: the manifests
and package metadata (manifest), the reference files and a weights file cut to its small tensors,
and that file's header alone (safetensors), the reference points (points), a reference frame whole
and cut short, and the reference PNG (frames; the first two bytes choose the frame size).
EXPORT_ONEWAY (a depthpack-manifest/5 export of a one-way model, the tiny preset's default since): its
manifest and its map-only package's depthpack.inputs (seed_oneway_*). The committed images, frames and
map seeds were written before it, as format 4 manifests: they stay, the seeds of the older format.
"""
from __future__ import annotations

import json
import struct
import sys
import zipfile
from pathlib import Path

from safetensors.torch import load_file, save

CORPUS = Path(__file__).resolve().parent / "corpus"


def package_metadata(pt2: Path) -> dict:
    with zipfile.ZipFile(pt2) as z:
        name = next(n for n in z.namelist() if n.endswith("_metadata.json"))
        return json.loads(z.read(name))


def write(target: str, name: str, data: bytes) -> None:
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed_{name}").write_bytes(data)


def main(images: Path, frames: Path, maps: Path, oneway: Path | None = None) -> None:
    if oneway is not None:
        write("manifest", "oneway_manifest.json", (oneway / "manifest.json").read_bytes())
        write("manifest", "oneway_map_inputs.json", package_metadata(oneway / "depthpack_map.pt2")["depthpack.inputs"].encode())
    for tag, d in (("images", images), ("frames", frames), ("map", maps)):
        write("manifest", f"{tag}_manifest.json", (d / "manifest.json").read_bytes())
        meta = package_metadata(d / "depthpack_k8.pt2")
        write("manifest", f"{tag}_inputs.json", meta["depthpack.inputs"].encode())
        write("safetensors", f"{tag}_reference.safetensors", (d / "reference.safetensors").read_bytes())
        write("points", f"{tag}_points.csv", (d / "reference_points.csv").read_bytes())
    write("manifest", "constants.json", package_metadata(images / "depthpack_k8.pt2")["depthpack.constants"].encode())
    weights = (images / "weights.safetensors").read_bytes()
    small = {k: v for k, v in load_file(str(images / "weights.safetensors")).items() if v.numel() <= 256}
    write("safetensors", "weights_small.safetensors", save(small))
    (n,) = struct.unpack("<Q", weights[:8])
    write("safetensors", "weights_header.safetensors", weights[: 8 + n])
    frame = load_file(str(frames / "reference.safetensors"))["frames"][0].numpy().tobytes()  # [h,w,3] uint8 bgr
    h, w = json.loads((frames / "manifest.json").read_text())["frame"]["size"]
    size = bytes([(h - 1) % 128, (w - 1) % 128])
    write("frames", "frame.raw", size + frame)
    write("frames", "frame_cut.raw", size + frame + frame[: len(frame) // 3])
    write("frames", "reference.png", bytes([0, 0]) + (images / "reference.png").read_bytes())


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(*map(Path, sys.argv[1:]))
