"""Rendered synthetic scenes kept compactly on disk: one row of bytes per scene, rendered once by every core.

    store = open_store(cfg, "train", (420, 560), render_batch, processes=16)   # renders what is missing, then opens it
    rows = store.rows                      # uint8 [n, row_bytes] (a read-only memmap)
    image, depth, focal = store.decode(rows[:4])    # uint8 [4,3,H,W], float16 [4,H,W] m (0 = sky), float32 [4]
    thin = decode_thin(rows[:4], store.layout)      # bool [4,H,W]: the thin band (synthetic scenes)

A row is image uint8 [3,H,W] (round(255 x), the renderer's [0,1] RGB) | depth float16 [H,W] meters
(the renderer's z-depth, 0 = no hit) | focal float32 (pixels at (H, W)) | for synthetic scenes the thin band,
one bit a pixel (numpy's packbits, row-major), each part starting at a multiple of 4 bytes and the row a
multiple of 4, so one uint8 tensor holds everything and a gathered batch of rows is cut into its parts by
views (no copy). 1.21 MB a scene at 420x560.

On disk: CACHE_DIR/KEY.npy (the rows; numpy's .npy format, memory-mapped) and CACHE_DIR/KEY.json
(what was rendered: n, wanted, complete, seconds). The renderer is passed in (synthetic.render_batch):
the store holds bytes and knows nothing of scenes. KEY names everything the bytes depend on: split,
scene kind, rig, seed, size and the number of scenes asked for. The worker processes write their rows
straight into the memory-mapped file (only indices travel back). With a time budget the rendering
stops when it is spent and keeps the first n scenes done, in order; the JSON is rewritten every few
seconds, so a killed renderer leaves a usable store of the scenes finished before it. A store that
was cut by its budget is accepted as it is by later runs (they do not render again).
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("depthpack.data")
VERSION = 3  # 2: the torch renderer and the scene families; 3: the thin band's bits (older stores render again)
CHUNK = 32  # scenes rendered together by a worker


def _align4(n: int) -> int:
    return (n + 3) // 4 * 4


@dataclass(frozen=True)
class RowLayout:
    height: int
    width: int
    thin: bool = False  # the row ends with the thin band's bits (synthetic scenes)

    @property
    def depth_at(self) -> int:
        return _align4(3 * self.height * self.width)

    @property
    def focal_at(self) -> int:
        return _align4(self.depth_at + 2 * self.height * self.width)

    @property
    def thin_at(self) -> int:
        return self.focal_at + 4

    @property
    def row_bytes(self) -> int:
        return _align4(self.thin_at + (-(-self.height * self.width // 8) if self.thin else 0))


def encode_rows(r: dict, layout: RowLayout) -> np.ndarray:
    """A render_batch() result (image [B,H,W,3], depth [B,H,W], K [B,3,3], and for a layout with the thin band
    thin [B,H,W]) -> rows uint8 [B, row_bytes]."""
    H, W = layout.height, layout.width
    image, depth, K = (np.asarray(r[k].cpu() if hasattr(r[k], "cpu") else r[k]) for k in ("image", "depth", "K"))
    B = image.shape[0]
    rows = np.zeros((B, layout.row_bytes), np.uint8)
    rows[:, :3 * H * W] = np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8).transpose(0, 3, 1, 2).reshape(B, -1)
    depth = np.where(np.isfinite(depth) & (depth > 0), depth, 0.0).astype(np.float16)
    rows[:, layout.depth_at:layout.depth_at + 2 * H * W] = depth.reshape(B, -1).view(np.uint8)
    focal = np.sqrt(K[:, 0, 0].astype(np.float64) * K[:, 1, 1]).astype(np.float32)
    rows[:, layout.focal_at:layout.focal_at + 4] = focal.reshape(B, 1).view(np.uint8)
    if layout.thin:
        bits = np.packbits(np.asarray(r["thin"].cpu() if hasattr(r["thin"], "cpu") else r["thin"]).reshape(B, -1), axis=1)
        rows[:, layout.thin_at:layout.thin_at + bits.shape[1]] = bits
    return rows


def decode_rows(rows, layout: RowLayout):
    """rows [n, row_bytes] uint8 (numpy or torch, any device) -> image uint8 [n,3,H,W], depth float16
    [n,H,W], focal float32 [n]: views into rows, no copy (torch: rows must be contiguous)."""
    H, W = layout.height, layout.width
    n = rows.shape[0]
    image = rows[:, :3 * H * W].reshape(n, 3, H, W)
    if isinstance(rows, np.ndarray):
        depth = rows[:, layout.depth_at:layout.depth_at + 2 * H * W].view(np.float16).reshape(n, H, W)
        focal = rows[:, layout.focal_at:layout.focal_at + 4].view(np.float32).reshape(n)
    else:
        import torch
        depth = rows[:, layout.depth_at:layout.depth_at + 2 * H * W].view(torch.float16).reshape(n, H, W)
        focal = rows[:, layout.focal_at:layout.focal_at + 4].view(torch.float32).reshape(n)
    return image, depth, focal


def decode_thin(rows: np.ndarray, layout: RowLayout) -> np.ndarray:
    """rows [n, row_bytes] uint8 of a layout with the thin band -> bool [n,H,W]."""
    H, W = layout.height, layout.width
    bits = np.asarray(rows)[:, layout.thin_at:layout.thin_at + -(-H * W // 8)]
    return np.unpackbits(bits, axis=1, count=H * W).reshape(-1, H, W).astype(bool)


def store_key(cfg, split: str, size: tuple[int, int], n: int) -> str:
    H, W = size
    f = cfg.families()
    return (f"synthetic_{split}_{cfg.scene}_{cfg.rig}_seed{cfg.seed}_{H}x{W}_n{n}"
            f"_thin{f.thin:g}_distant{f.distant:g}_front{f.front:g}_wref{f.width_ref}"
            + (f"_fence{f.fence:g}" if f.fence else ""))  # stores made before fences keep their names


class SceneStore:
    """An opened store: rows (memmap, read-only) of the first n scenes of (split, seed, ...)."""

    def __init__(self, path: Path, meta: dict):
        self.path, self.meta = path, meta
        self.layout = RowLayout(*meta["size"], bool(meta.get("thin")))
        self.n = int(meta["n"])
        rows = np.load(path, mmap_mode="r")
        if rows.shape[1] != self.layout.row_bytes or rows.shape[0] < self.n:
            raise ValueError(f"scene store {path}: shape {rows.shape} does not match its JSON ({self.n} rows of "
                             f"{self.layout.row_bytes} bytes); delete it to render again")
        self.rows = rows[:self.n]

    def __len__(self) -> int:
        return self.n

    def decode(self, rows):
        return decode_rows(rows, self.layout)

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray, float]:
        """Scene i: image uint8 [H,W,3], depth float32 [H,W] meters (0 = no hit), focal (pixels)."""
        image, depth, focal = decode_rows(np.asarray(self.rows[i:i + 1]), self.layout)
        return np.ascontiguousarray(image[0].transpose(1, 2, 0)), depth[0].astype(np.float32), float(focal[0])

    def thin(self, i: int) -> np.ndarray:
        """Scene i's thin band, bool [H,W] (a store of synthetic scenes)."""
        return decode_thin(self.rows[i:i + 1], self.layout)[0]


# ---- rendering into a store (fork workers write their rows into the memmap) -----------------------
_W: dict = {}


def _init_worker(path: str, layout: RowLayout, job: tuple, render) -> None:
    import torch

    torch.set_num_threads(1)  # one process per core
    _W.update(rows=np.load(path, mmap_mode="r+"), layout=layout, job=job, render=render)


def _render_into(span: tuple[int, int]) -> tuple[int, int]:
    seed, size, scene, split, rig, families = _W["job"]
    a, b = span
    _W["rows"][a:b] = encode_rows(_W["render"](seed, range(a, b), size, scene, split, rig, families), _W["layout"])
    return span


def _write_meta(path: Path, meta: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, path)


def render_store(cfg, split: str, size: tuple[int, int], n: int, render, processes: int | None = None,
                 budget_s: float | None = None, progress: bool = False) -> SceneStore:
    """Render scenes 0..n-1 of (cfg.seed, split) with render(seed, indices, size, scene, split, rig, families)
    (depthpack.data.synthetic.render_batch), CHUNK scenes at a time, into cfg.cache_dir (or stop when
    budget_s is spent, keeping the first ones done in order); open the store."""
    import multiprocessing as mp

    from tqdm import tqdm

    root = Path(cfg.cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    key = store_key(cfg, split, size, n)
    npy, js = root / f"{key}.npy", root / f"{key}.json"
    layout = RowLayout(int(size[0]), int(size[1]), thin=True)
    js.unlink(missing_ok=True)
    rows = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint8, shape=(n, layout.row_bytes))
    del rows
    meta = dict(version=VERSION, key=key, split=split, scene=cfg.scene, rig=cfg.rig, seed=cfg.seed,
                size=[layout.height, layout.width], thin=True, row_bytes=layout.row_bytes, wanted=n, n=0, complete=False,
                budget_s=budget_s, seconds=0.0)
    processes = max(1, processes or os.cpu_count() or 1)
    job = (cfg.seed, (layout.height, layout.width), cfg.scene, split, cfg.rig, cfg.families())
    t0 = last = time.perf_counter()
    done = np.zeros(n, bool)
    prefix = 0  # scenes 0..prefix-1 are all done
    bar = tqdm(total=n, desc=f"render {split} scenes", disable=not progress, dynamic_ncols=True)
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    pool = ctx.Pool(processes, initializer=_init_worker, initargs=(str(npy), layout, job, render))
    cut = False
    try:
        spans = [(a, min(n, a + CHUNK)) for a in range(0, n, CHUNK)]
        for a, b in pool.imap_unordered(_render_into, spans, chunksize=1):
            done[a:b] = True
            while prefix < n and done[prefix]:
                prefix += 1
            bar.update(b - a)
            now = time.perf_counter()
            if budget_s is not None and now - t0 > budget_s:
                cut = prefix < n
                break
            if now - last > 5.0:  # a usable store even if this process is killed
                _write_meta(js, {**meta, "n": prefix, "seconds": round(now - t0, 2)})
                last = now
    finally:
        pool.terminate()
        pool.join()
        bar.close()
    meta.update(n=prefix, complete=not cut and prefix == n, seconds=round(time.perf_counter() - t0, 2))
    _write_meta(js, meta)
    if cut:
        log.warning("render %s: budget of %.0f s spent after %d of %d scenes; the store keeps those", key,
                    budget_s, prefix, n)
    return SceneStore(npy, meta)


def find_store(cfg, split: str, size: tuple[int, int], n: int) -> SceneStore | None:
    """The store of these scenes if one is on disk (complete, or cut by its budget), else None."""
    if not cfg.cache_dir:
        return None
    key = store_key(cfg, split, size, n)
    npy, js = Path(cfg.cache_dir) / f"{key}.npy", Path(cfg.cache_dir) / f"{key}.json"
    if not (npy.is_file() and js.is_file()):
        return None
    try:
        meta = json.loads(js.read_text())
    except (OSError, ValueError):
        return None
    if meta.get("version") != VERSION or int(meta.get("n", 0)) < 1:
        return None
    return SceneStore(npy, meta)


def open_store(cfg, split: str, size: tuple[int, int], render, n: int | None = None, processes: int | None = None,
               budget_s: float | None = None, progress: bool = False) -> SceneStore:
    """The store on disk if there is one, else rendered now with render (needs cfg.cache_dir)."""
    if not cfg.cache_dir:
        raise ValueError("a scene store needs data.cache_dir (where the rendered scenes are kept)")
    n = n if n is not None else (cfg.num_samples if split == "train" else cfg.num_val)
    found = find_store(cfg, split, size, n)
    if found is not None:
        if not found.meta.get("complete"):
            log.warning("scene store %s holds %d of %d scenes (rendering stopped at its budget)", found.path,
                        found.n, n)
        return found
    return render_store(cfg, split, size, n, render, processes, budget_s, progress)
