"""Checkpoints: atomic, verifiable, resumable, and never unpickled.

Layout of a run folder (``out_dir``)::

    out_dir/
      config.yaml                 the merged TrainConfig of the run
      latest.json                 {"step": S, "path": "checkpoints/step_0000S"}; written last
      checkpoints/step_0000S/
        model.safetensors         the weights (safetensors: no code can hide in it)
        state.pt                  optimizer, scheduler, step, RNG states, data position
                                  (plain tensors/containers; read with torch.load(weights_only=True))
        config.json               {"model": ModelConfig, "train": TrainConfig} as plain dicts
        meta.json                 size + sha256 of the three files above; written after them

Every file is written to a temporary name, fsynced and renamed (``os.replace``), so a reader never
sees half a file under a final name. ``meta.json`` is written after the files it describes and
``latest.json`` after ``meta.json``: a checkpoint without a valid ``meta.json`` is incomplete, and a
file whose size or hash differs from ``meta.json`` is corrupt. Both are reported with their path and
the previous checkpoint is used instead (the last ``keep`` checkpoints are kept, 2 by default). A
training run deletes the incomplete ones when it starts (``remove_incomplete``).

``load_model(path)`` rebuilds a DepthPack from any of: a run folder, a checkpoint folder, or a
weights file of any name (with its ``config.json`` beside it): a file path loads that very file.
"""
from __future__ import annotations

import json
import random
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .config import stored_model_config
from .model import DepthPack
from .files import atomic_write_bytes, atomic_write_json, remove_stale_temporaries, sha256_bytes

WEIGHTS, STATE, CONFIG, META, LATEST = "model.safetensors", "state.pt", "config.json", "meta.json", "latest.json"
CKPT_DIR = "checkpoints"


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or corrupt (the message names the file)."""


# ---- RNG state as plain tensors / containers (loadable with weights_only=True) -----------------
def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()  # ('MT19937', uint32[624], pos, has_gauss, cached)
    py_state = random.getstate()  # (version, tuple of 625 ints, gauss)
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- save ---------------------------------------------------------------------------------------
def step_dir(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / CKPT_DIR / f"step_{step:08d}"


def save_checkpoint(out_dir: str | Path, step: int, model: torch.nn.Module, state: dict[str, Any],
                    config: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint `step` atomically, then latest.json, then prune to the last `keep`.

    model: the bare DepthPack (not the DDP wrapper); state: the training state (tensors, numbers,
    lists, dicts only); config: {"model": ..., "train": ...} plain dicts. Returns the checkpoint folder.
    """
    from safetensors.torch import save as st_save

    d = step_dir(out_dir, step)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    blobs = {
        WEIGHTS: st_save(tensors, metadata={"format": "pt", "step": str(step)}),
        STATE: _torch_bytes(state),
        CONFIG: (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
    }
    for name, data in blobs.items():
        atomic_write_bytes(d / name, data)
    atomic_write_json(d / META, {"step": step, "files": {n: {"size": len(b), "sha256": sha256_bytes(b)} for n, b in blobs.items()}})
    atomic_write_json(Path(out_dir) / LATEST, {"step": step, "path": str(d.relative_to(out_dir))})
    _prune(out_dir, keep)
    return d


def _torch_bytes(obj: Any) -> bytes:
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _prune(out_dir: str | Path, keep: int) -> None:
    dirs = list_checkpoints(out_dir)
    for d in dirs[:-keep] if keep > 0 else []:
        (d / META).unlink(missing_ok=True)  # first: a prune cut short leaves an incomplete folder, not a corrupt one
        shutil.rmtree(d, ignore_errors=True)


def remove_incomplete(out_dir: str | Path) -> list[Path]:
    """Delete the checkpoint folders of a run without meta.json (a write or a prune that a kill or a full
    disk cut short: never a usable checkpoint), except one a live process is writing; returns them."""
    gone = []
    for d in list_checkpoints(out_dir):
        remove_stale_temporaries(d)
        if not (d / META).exists() and not any(d.glob(".*.tmp*")):
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone


# ---- find + verify + load -----------------------------------------------------------------------
def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Checkpoint folders of a run, oldest first (by step number in the name)."""
    root = Path(out_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir() if p.is_dir() and _is_step_name(p.name)]
    return sorted(dirs, key=lambda p: int(p.name[5:]))


def _is_step_name(name: str) -> bool:
    return name.startswith("step_") and name[5:].isdigit()


def _in_run(d: Path) -> bool:
    """d is a checkpoint folder inside a run (RUN/checkpoints/step_N), where meta.json is always written."""
    return d.parent.name == CKPT_DIR and _is_step_name(d.name)


def verify_checkpoint(d: str | Path, names: tuple[str, ...] = (WEIGHTS, STATE, CONFIG)) -> dict[str, bytes]:
    """Read and check the files of checkpoint folder d against its meta.json; returns their bytes.
    Raises CheckpointError naming the file that is missing, truncated or corrupt."""
    d = Path(d)
    meta_path = d / META
    if not d.is_dir():  # latest.json naming a step folder someone deleted
        raise CheckpointError(f"checkpoint {d} is gone: the folder does not exist")
    if not meta_path.is_file():
        raise CheckpointError(f"checkpoint {d} is incomplete: {META} is missing (the write was interrupted?)")
    try:  # ValueError also covers bytes that are not UTF-8 (UnicodeDecodeError)
        meta = json.loads(meta_path.read_bytes())
        files = meta["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {meta_path} is corrupt: {type(e).__name__}: {e}") from None
    if not isinstance(files, dict):
        raise CheckpointError(f"checkpoint {meta_path} is corrupt: 'files' is not a mapping")
    out = {}
    for name in names:
        path = d / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing")
        if name not in files:
            raise CheckpointError(f"checkpoint {meta_path} does not describe {name}")
        want = files[name]
        size, digest = (want.get("size"), want.get("sha256")) if isinstance(want, dict) else (None, None)
        if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0 and isinstance(digest, str)):
            # an entry without its size or hash proves nothing: as corrupt as a wrong hash
            raise CheckpointError(f"checkpoint {meta_path} is corrupt: its entry for {name} lacks a size and sha256")
        data = path.read_bytes()
        if len(data) != size:
            raise CheckpointError(f"checkpoint file {path} is truncated or corrupt: {len(data)} bytes, expected {size}")
        if sha256_bytes(data) != digest:
            raise CheckpointError(f"checkpoint file {path} is corrupt: sha256 differs from {META}")
        if name == CONFIG:
            parse_config(data, path)
        out[name] = data
    return out


def parse_config(data: bytes, where: str | Path) -> dict[str, Any]:
    """A checkpoint's config.json: {"model": ModelConfig fields, "train": ...}, the model part checked by
    building its ModelConfig. One CheckpointError naming the file otherwise (a config.json of another
    program or version verifies against its hash and still cannot rebuild the model)."""
    try:
        stored = json.loads(data)
    except ValueError as e:
        raise CheckpointError(f"{where}: not a depthpack checkpoint config (not JSON: {e})") from None
    if not isinstance(stored, dict) or not isinstance(stored.get("model"), dict):
        raise CheckpointError(f"{where}: not a depthpack checkpoint config (no \"model\" mapping)")
    if not isinstance(stored.get("train", {}), dict):
        raise CheckpointError(f"{where}: not a depthpack checkpoint config (\"train\" is not a mapping)")
    try:
        stored_model_config({**stored["model"], "backbone_weights": None})
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{where}: its model config cannot be built ({e})") from None
    return stored


def load_state_bytes(data: bytes, where: str | Path = "<bytes>") -> dict[str, Any]:
    """torch.load with weights_only=True: tensors and plain containers only, never arbitrary objects."""
    import io
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before it refuses
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # pickle.UnpicklingError for forbidden globals, RuntimeError for bad zips
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [""]
        why = next((ln for ln in lines if not ln.startswith(_TORCH_LOAD_BOILERPLATE)), lines[0])
        raise CheckpointError(f"{where}: refused or unreadable training state ({type(e).__name__}: {why})") from None


# the lines of torch.load's refusal that say nothing about the file (one even advises weights_only=False)
_TORCH_LOAD_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def load_weights_bytes(data: bytes, where: str | Path = "<bytes>") -> dict[str, torch.Tensor]:
    from safetensors.torch import load as st_load
    try:
        return st_load(data)
    except Exception as e:
        raise CheckpointError(f"{where}: not a readable safetensors file ({type(e).__name__}: {e})") from None


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str | Path) -> None:
    """state into model, strictly; one CheckpointError line saying which tensors differ otherwise."""
    own = model.state_dict()
    differ = {"missing": [k for k in own if k not in state], "unexpected": [k for k in state if k not in own],
              "of another shape": [k for k in own if k in state and state[k].shape != own[k].shape]}
    said = [f"{len(ks)} {what} ({', '.join(ks[:3])}{', ...' if len(ks) > 3 else ''})"
            for what, ks in differ.items() if ks]
    if said:
        raise CheckpointError(f"{where} holds the weights of another model: tensors " + "; ".join(said))
    model.load_state_dict(state, strict=True)


def latest_checkpoint(out_dir: str | Path, use: Callable[[Path, dict[str, bytes]], Any] | None = None
                      ) -> tuple[Path, Any] | None:
    """The newest checkpoint of a run that verifies, with its file bytes; None if the run has none.

    latest.json names the newest complete one; if it is corrupt (or latest.json is), older
    checkpoints are tried in turn, newest first, each failure warned about with its path. With `use`,
    a checkpoint must also pass use(folder, file bytes), which raises CheckpointError where it cannot
    use it (e.g. weights of another model), and the pair holds what use returned instead of the bytes.
    """
    out_dir = Path(out_dir)
    candidates = list(reversed(list_checkpoints(out_dir)))
    latest = out_dir / LATEST
    if latest.is_file():
        try:  # ValueError: not JSON, or not UTF-8
            named = out_dir / json.loads(latest.read_bytes())["path"]
            candidates = [named] + [c for c in candidates if c.resolve() != named.resolve()]
        except (ValueError, KeyError, TypeError) as e:
            warnings.warn(f"{latest} is corrupt ({type(e).__name__}: {e}); scanning {out_dir / CKPT_DIR} instead")
    errors = []
    for d in candidates:
        try:
            blobs = verify_checkpoint(d)
            found = d, blobs if use is None else use(d, blobs)
        except CheckpointError as e:
            errors.append(str(e))
            continue
        for e in errors:  # said only when an older checkpoint is used; a total failure is one error below
            warnings.warn(f"{e}; using the previous checkpoint")
        return found
    if errors:
        raise CheckpointError(f"no usable checkpoint in {out_dir}: " + "; ".join(errors))
    return None


def resolve_checkpoint(path: str | Path) -> Path:
    """A run folder, a checkpoint folder or a weights file -> the checkpoint folder (the file's folder)."""
    return checkpoint_files(path)[0]


def checkpoint_files(path: str | Path) -> tuple[Path, Path]:
    """(checkpoint folder, weights file) of a run folder (its newest checkpoint that verifies), a
    checkpoint folder (its model.safetensors) or a weights file of any name (that file, with the
    config.json beside it): a file path never stands for another file of its folder."""
    path = Path(path)
    if path.is_file():
        return path.parent, path
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if (path / WEIGHTS).is_file():
        return path, path / WEIGHTS
    found = latest_checkpoint(path)
    if found is None:
        raise CheckpointError(f"{path} holds no checkpoint (no {WEIGHTS}, no {LATEST}, no {CKPT_DIR}/step_*)")
    return found[0], found[0] / WEIGHTS


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """Rebuild a DepthPack from a checkpoint, in eval mode.

    path: a run folder (its newest checkpoint that verifies), a checkpoint folder, or a weights file
    (model.safetensors or any other name, e.g. best_step18.safetensors) with its config.json beside
    it: a file path loads that file. The model is built from the stored ModelConfig (never from a
    backbone file: the trained weights replace it) and loaded strictly: a missing, extra or misshapen
    tensor is an error naming the file. Where meta.json describes the files they are checked against
    it (size + sha256) first; a run's checkpoint folder without meta.json is incomplete (refused, as
    verify_checkpoint refuses it); weights that no meta.json describes load with one warning saying they
    cannot be checked. Nothing is unpickled.
    """
    d, weights = checkpoint_files(path)
    if not (d / CONFIG).is_file():
        raise CheckpointError(f"checkpoint {path}: {CONFIG} is missing (the weights {weights.name} load with the "
                              f"{CONFIG} beside them, in {d})")
    if (d / META).is_file() or _in_run(d):  # meta.json hashes config.json, and the weights when they are its model.safetensors
        blobs = verify_checkpoint(d, (WEIGHTS, CONFIG) if weights.name == WEIGHTS else (CONFIG,))
    else:  # a bare weights file + config.json (e.g. copied by hand): no hashes to check
        blobs = {CONFIG: (d / CONFIG).read_bytes()}
    data = blobs[WEIGHTS] if WEIGHTS in blobs else weights.read_bytes()
    stored = parse_config(blobs[CONFIG], d / CONFIG)
    model = DepthPack(stored_model_config({**stored["model"], "backbone_weights": None}))
    load_weights(model, load_weights_bytes(data, weights), weights)
    if WEIGHTS not in blobs:  # after every refusal: a refusal stays one line
        warnings.warn(f"{weights}: no {META} describes these weights, so their size and sha256 cannot be checked; "
                      f"loaded them as they are")
    model.eval()
    if dtype is not None:
        model.to(dtype=dtype)
    return model.to(device)


def stored_config(path: str | Path) -> dict[str, Any]:
    """The {"model": ..., "train": ...} dict stored with a checkpoint (run folder, folder or file)."""
    d = resolve_checkpoint(path)
    return parse_config((d / CONFIG).read_bytes(), d / CONFIG)
