"""The data sets: synthetic scenes, NYU Depth v2 (.mat and folder), KITTI, generic folders, ROS bags.

Each returns, for dataset[i], dict(image [3,H,W] float32 in [0,1], depth [H,W] float32 meters (0 where
invalid), valid [H,W] bool, eval_mask [H,W] bool, name str) at the requested size.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from .common import BadSample, SkippingDataset, log, make_sample, split_range
from .config import DataConfig
from .formats import check_depth_extension, read_depth, read_rgb
from .intrinsics import dataset_focal, kitti_focal
from .synthetic import render_batch

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".ppm", ".bmp")
DEPTH_EXTS = (".png", ".npy", ".pfm", ".pgm")


def _render_span(job: tuple) -> dict:
    """Scenes [a, b) of a split, rendered together on the CPU in this process (one thread)."""
    torch.set_num_threads(1)
    seed, (a, b), size, scene, split, rig, families = job
    r = render_batch(seed, range(a, b), size, scene, split, rig, families)
    return dict(image=r["image"].numpy(), depth=r["depth"].numpy(), thin=r["thin"].numpy(), K=r["K"].numpy())


class SyntheticDataset(SkippingDataset):
    """Procedural rooms / streets rendered at the requested size; sample i of a split is always the same.

    train and val draw from disjoint random streams (seed, split, index), so val scenes are held out.
    """

    def __init__(self, cfg, split: str, size, min_depth: float, max_depth: float):
        super().__init__(size, min_depth, max_depth, cfg)
        if split not in ("train", "val"):
            raise ValueError(f"split={split!r} is not one of ('train', 'val') for synthetic data")
        self.split = split
        self.n = cfg.num_samples if split == "train" else cfg.num_val
        self._cache: dict[int, dict] = {}
        self.store = None
        if cfg.cache_dir and not (cfg.fresh and split == "train"):  # rendered once into a store on disk, read from there
            from .store import open_store
            self.store = open_store(cfg, split, self.size, render_batch, self.n,
                                    budget_s=cfg.render_budget_s if split == "train" else None)
            self.n = self.store.n

    def __len__(self) -> int:
        return self.n

    def describe(self) -> str:
        return f"synthetic {self.cfg.scene} {self.split} (seed {self.cfg.seed}, {self.n} scenes)"

    def _job(self, a: int, b: int) -> tuple:
        c = self.cfg
        return (c.seed, (a, b), self.size, c.scene, self.split, c.rig, c.families())

    def _sample(self, i: int, image: np.ndarray, depth: np.ndarray, K: np.ndarray, thin: np.ndarray) -> dict:
        name = f"synthetic_{self.split}_{self.cfg.seed}_{i:06d}"
        return make_sample(image, depth, self.size, self.cfg, self.min_depth, self.max_depth, name, name,
                           focal=(float(K[0, 0]), float(K[1, 1])), thin=thin)  # the renderer's camera, at its size

    def load(self, i: int) -> dict:
        if i in self._cache:
            return dict(self._cache[i])
        if self.store is not None:
            image, depth, focal = self.store.sample(i)
            name = f"synthetic_{self.split}_{self.cfg.seed}_{i:06d}"
            return make_sample(image, depth, self.size, self.cfg, self.min_depth, self.max_depth, name, name,
                               focal=(focal, focal), thin=self.store.thin(i))
        c = self.cfg
        r = render_batch(c.seed, [i], self.size, c.scene, self.split, c.rig, c.families())
        s = self._sample(i, r["image"][0].numpy(), r["depth"][0].numpy(), r["K"][0].numpy(), r["thin"][0].numpy())
        if self.cfg.cache:
            self._cache[i] = s
        return dict(s)

    def prefill(self, processes: int, progress: bool = False, chunk: int = 32) -> None:
        """Render every scene into the cache now, `chunk` scenes at a time in `processes` forked processes
        (the same bytes as rendering each on first use; numpy arrays travel back, the tensors are made here).
        Nothing with a scene store open: the store holds every scene already (and data.device_cache reads only it)."""
        if self.store is not None:
            return
        import multiprocessing as mp

        from tqdm import tqdm

        todo = [i for i in range(self.n) if i not in self._cache]
        spans: list[list[int]] = []  # runs of consecutive scenes, at most chunk long
        for i in todo:
            if spans and spans[-1][1] == i and spans[-1][1] - spans[-1][0] < chunk:
                spans[-1][1] += 1
            else:
                spans.append([i, i + 1])
        bar = tqdm(total=len(todo), desc="render scenes", disable=not progress, dynamic_ncols=True)

        def keep(a: int, r: dict) -> None:
            for j in range(r["image"].shape[0]):
                if a + j not in self._cache:
                    self._cache[a + j] = self._sample(a + j, r["image"][j], r["depth"][j], r["K"][j], r["thin"][j])
            bar.update(r["image"].shape[0])
        jobs = [self._job(a, b) for a, b in spans]
        if processes > 1 and len(jobs) > 1 and "fork" in mp.get_all_start_methods():
            # a plain function and plain arguments: a bound method would pickle the dataset, its
            # growing cache of tensors with it (each tensor a file descriptor: "too many open files")
            with mp.get_context("fork").Pool(processes) as pool:
                for (a, _), r in zip(spans, pool.imap(_render_span, jobs)):
                    keep(a, r)
        else:
            threads = torch.get_num_threads()
            try:
                for (a, _), job in zip(spans, jobs):
                    keep(a, _render_span(job))
            finally:
                torch.set_num_threads(threads)
        bar.close()


class PairsDataset(SkippingDataset):
    """RGB file + depth file per sample (NYU folder, KITTI, generic folder)."""

    def __init__(self, pairs: list[tuple[Path, Path]], names: list[str], cfg, size, min_depth, max_depth, label: str):
        super().__init__(size, min_depth, max_depth, cfg)
        self.pairs, self.names, self.label = pairs, names, label
        self.focal = dataset_focal(cfg)  # one for all, or None: per sample (KITTI's calib) or unknown

    def __len__(self) -> int:
        return len(self.pairs)

    def describe(self) -> str:
        return f"{self.label} ({len(self.pairs)} pairs)"

    def load(self, i: int) -> dict:
        rgb_path, depth_path = self.pairs[i]
        rgb = read_rgb(rgb_path)
        depth = read_depth(depth_path, self.cfg.scale(), self.cfg.decode, self.cfg.invalid_raw)
        focal = self.focal
        if focal is None and self.cfg.kind == "kitti":
            try:
                focal = kitti_focal(rgb_path)
            except (ValueError, OSError) as e:  # a broken calib file: the sample is bad, not the run
                raise BadSample(rgb_path, f"calibration: {e}") from None
        return make_sample(rgb, depth, self.size, self.cfg, self.min_depth, self.max_depth, self.names[i], depth_path,
                           focal=focal)


class NyuMatDataset(SkippingDataset):
    """The official nyu_depth_v2_labeled.mat (MATLAB v7.3 = HDF5), read with h5py.

    MATLAB writes column-major, so h5py sees images as [N, 3, W, H] uint8 and depths as [N, W, H]
    float32 meters: image i is images[i].transpose(2, 1, 0) -> [H, W, 3], depth i is depths[i].T.
    The file is opened lazily in each process (h5py handles do not survive fork/pickle).
    """

    def __init__(self, path: Path, indices: list[int], cfg, size, min_depth, max_depth):
        super().__init__(size, min_depth, max_depth, cfg)
        self.path, self.indices = Path(path), list(indices)
        self._h5 = None
        self._pid = None

    def __len__(self) -> int:
        return len(self.indices)

    def describe(self) -> str:
        return f"NYU Depth v2 {self.path} ({len(self.indices)} images)"

    def file(self):
        if self._h5 is None or self._pid != os.getpid():
            self._h5, self._pid = open_nyu_mat(self.path), os.getpid()
        return self._h5

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_h5"] = None
        return state

    def load(self, i: int) -> dict:
        f = self.file()
        k = self.indices[i]
        try:
            img = np.asarray(f["images"][k])  # [3, W, H]
            depth = np.asarray(f["depths"][k], dtype=np.float32)  # [W, H]
        except (OSError, KeyError, ValueError) as e:
            raise BadSample(f"{self.path}[{k}]", f"cannot read image {k} ({e})") from None
        if img.ndim != 3 or img.shape[0] != 3 or depth.shape != img.shape[1:]:
            raise BadSample(f"{self.path}[{k}]", f"images[{k}] {img.shape} / depths[{k}] {depth.shape} are not [3,W,H] / [W,H]")
        rgb = np.ascontiguousarray(img.transpose(2, 1, 0))  # [H, W, 3]
        return make_sample(rgb, depth.T, self.size, self.cfg, self.min_depth, self.max_depth, f"nyu_{k:05d}",
                           f"{self.path}[{k}]", focal=dataset_focal(self.cfg))


def open_nyu_mat(path):
    import h5py  # only this loader needs it

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"NYU .mat {path}: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ValueError(f"NYU .mat {path}: not an HDF5 / MATLAB v7.3 file ({e})") from None
    missing = [k for k in ("images", "depths") if k not in f]
    if missing:
        raise ValueError(f"NYU .mat {path}: missing datasets {missing} (has {sorted(f.keys())})")
    return f


# ----------------------------------------------------------------------------- listing files
def split_file_path(cfg: DataConfig, key: str) -> Path:
    """The file cfg's split_file or val_split_file (key) names: an absolute path as written; a relative one
    inside data.root (its folder when root is a file, nyu_mat's .mat), as the list's own lines are. One
    ValueError naming the key and the path looked at if it is not a file there."""
    given = Path(getattr(cfg, key))
    path, base = given, None
    if not given.is_absolute() and cfg.root:
        root = Path(cfg.root)
        base = root.parent if root.is_file() else root
        path = base / given
    if path.is_dir():
        raise ValueError(f"data.{key} {path}: is a folder, not a file")
    if not path.is_file():
        where = f" (a relative data.{key} is read from data.root {base})" if base else ""
        moved = f"; {given} lies in the working folder: give its absolute path" if base and given.is_file() else ""
        raise ValueError(f"data.{key} {path}: no such file{where}{moved}")
    return path


def read_split_file(path, root: Path, depth_root: Path) -> tuple[list[tuple[Path, Path]], list[str]]:
    """Lines "rgb_path depth_path [anything]" of the file at path (split_file_path found it); paths relative to
    root / depth_root (a leading '/' as in BTS's lists is relative too). '#' comments and blank lines are
    ignored; depth 'None' (BTS's Eigen test lines without ground truth) is skipped and counted in the log."""
    path = Path(path)
    pairs, names, no_gt = [], [], 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        tok = line.split()
        if len(tok) < 2:
            raise ValueError(f"split_file {path}:{n}: expected 'rgb_path depth_path', got {line!r}")
        if tok[1] == "None":
            no_gt += 1
            continue
        try:
            check_depth_extension(tok[1])
        except ValueError as e:
            raise ValueError(f"split_file {path}:{n}: {e}") from None
        pairs.append((_resolve(root, tok[0]), _resolve(depth_root, tok[1])))
        names.append(str(Path(tok[0].lstrip("/")).with_suffix("")))
    if no_gt:
        log.info("split_file %s: %d lines without ground truth (depth None) left out", path, no_gt)
    return pairs, names


def _resolve(root: Path, p: str) -> Path:
    rel = root / p.lstrip("/")
    return rel if rel.exists() or not Path(p).is_absolute() or not Path(p).exists() else Path(p)


def _first_existing(stem: Path, exts) -> Path:
    for e in exts:
        if stem.with_suffix(e).exists():
            return stem.with_suffix(e)
    return stem.with_suffix(exts[0])  # missing: reported (and skipped) when loaded


def list_subfolders(root: Path, rgb_dir: str = "rgb", depth_dir: str = "depth", depth_name=lambda s: s):
    """root/rgb/NAME.{png,jpg,...} paired with root/depth/NAME.{png,npy,pfm}."""
    rgbs = sorted(p for p in (root / rgb_dir).iterdir() if p.suffix.lower() in IMAGE_EXTS)
    pairs = [(p, _first_existing(root / depth_dir / depth_name(p.stem), DEPTH_EXTS)) for p in rgbs]
    return pairs, [p.stem for p in rgbs]


def list_nyu_folder(root: Path):
    """BTS / Metric3D layout, searched recursively: rgb_XXXXX.jpg beside sync_depth_XXXXX.png."""
    rgbs = sorted(p for p in root.rglob("rgb_*") if p.suffix.lower() in IMAGE_EXTS)
    pairs = [(p, p.with_name("sync_depth_" + p.stem[len("rgb_"):] + ".png")) for p in rgbs]
    return pairs, [str(p.relative_to(root).with_suffix("")) for p in rgbs]


def list_kitti(root: Path):
    """rgb/ + depth/ with matching names, or the official val_selection_cropped layout
    (image/X_image_Y.png + groundtruth_depth/X_groundtruth_depth_Y.png)."""
    if (root / "image").is_dir() and (root / "groundtruth_depth").is_dir():
        return list_subfolders(root, "image", "groundtruth_depth", lambda s: s.replace("_image_", "_groundtruth_depth_"))
    return list_subfolders(root, "rgb", "depth")


def list_pairs(cfg) -> tuple[list[tuple[Path, Path]], list[str]]:
    root = Path(cfg.root)
    if not root.exists():
        raise ValueError(f"data root {root}: no such folder")
    if cfg.split_file:
        return read_split_file(split_file_path(cfg, "split_file"), root, Path(cfg.depth_root or cfg.root))
    if cfg.kind == "nyu":
        return list_nyu_folder(root)
    if not (root / "rgb").is_dir() and not (cfg.kind == "kitti" and (root / "image").is_dir()):
        raise ValueError(f"data root {root}: expected rgb/ and depth/ subfolders (or give split_file)")
    return list_kitti(root) if cfg.kind == "kitti" else list_subfolders(root)


LABELS = {"nyu": "NYU Depth v2 folder", "kitti": "KITTI depth", "folder": "depth folder"}


def make_dataset(cfg: DataConfig, split: str, img_size: tuple[int, int], min_depth: float,
                 max_depth: float) -> torch.utils.data.Dataset:
    """The data set cfg describes, split "train" | "val" (| "all" for file-based kinds), at img_size (H, W).

    File-based data sets load their first sample at once, so an empty or unreadable data set is a
    ValueError here rather than in the middle of training.
    """
    if isinstance(img_size, int):
        img_size = (img_size, img_size)
    img_size = (int(img_size[0]), int(img_size[1]))
    if split not in ("train", "val", "all"):
        raise ValueError(f"split={split!r} is not one of ('train', 'val', 'all')")
    if cfg.kind == "synthetic":
        return SyntheticDataset(cfg, "train" if split == "all" else split, img_size, min_depth, max_depth)
    if cfg.kind == "bag":
        from .rosbag import BagDataset  # rosbags is imported only by bag data sets
        ds = BagDataset(cfg, split, img_size, min_depth, max_depth)
        ds.check_nonempty()
        return ds
    key = "val_split_file" if split == "val" and cfg.val_split_file else "split_file"
    listfile = split_file_path(cfg, key) if getattr(cfg, key) else None
    if cfg.kind == "nyu_mat":
        with open_nyu_mat(cfg.root) as f:
            n = int(f["images"].shape[0])
        indices = read_indices(listfile, n) if listfile else list(split_range(n, split, cfg.num_val))
        ds = NyuMatDataset(Path(cfg.root), indices, cfg, img_size, min_depth, max_depth)
    else:
        if listfile:
            pairs, names = read_split_file(listfile, Path(cfg.root), Path(cfg.depth_root or cfg.root))
        else:
            pairs, names = list_pairs(_without_split(cfg))
            keep = split_range(len(pairs), split, cfg.num_val)
            pairs, names = [pairs[i] for i in keep], [names[i] for i in keep]
        ds = PairsDataset(pairs, names, cfg, img_size, min_depth, max_depth, f"{LABELS[cfg.kind]} {cfg.root} [{split}]")
    ds.check_nonempty()
    return ds


def _without_split(cfg: DataConfig) -> DataConfig:
    import dataclasses
    return dataclasses.replace(cfg, split_file=None)


def read_indices(path, n: int) -> list[int]:
    """0-based image indices, one per line ('#' comments allowed), of the file at path (split_file_path found
    it); each must be < n."""
    path = Path(path)
    out = []
    for k, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            i = int(line)
        except ValueError:
            raise ValueError(f"split_file {path}:{k}: expected a 0-based image index, got {line!r}") from None
        if not 0 <= i < n:
            raise ValueError(f"split_file {path}:{k}: index {i} outside the file's {n} images")
        out.append(i)
    return out
