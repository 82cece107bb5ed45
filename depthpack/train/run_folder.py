"""The run folder: made ready before anything reads it, restored from on resume, saved into at checkpoints.

    with prepare_out_dir(out):                            # rank 0, before anything else reads out; the run's lock
    start_step = restore(cfg, out, model, opt, sched, d)  # 0 for a new run
    save(out, step, model, opt, sched, cfg, d.world)      # rank 0, a checkpoint of step

Folder: config.yaml, log.csv, eval.csv, summary.json, latest.json + checkpoints/ (depthpack.core.checkpoint),
train.lock (the PID of the trainer that holds the folder; empty when none does).
A checkpoint holds the learning rates as floats whatever the live optimizer holds (plain_lr_state), so a
run may resume with graph=true or graph=false.
"""
from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch

from ..core import checkpoint as ckpt
from ..core.config import ModelConfig, dotted, stored_model_config, to_dict
from ..core.files import check_writable_dir, pid_lock, remove_stale_temporaries
from ..core.model import DepthPack
from .config import TrainConfig
from .distributed import Dist


LOCK = "train.lock"  # in the run folder: the PID of the trainer that holds it (core.files.pid_lock)


@contextlib.contextmanager
def prepare_out_dir(out: Path) -> Iterator[None]:
    """Rank 0, before anything reads it, held for the whole run: out takes files, is this trainer's alone (its
    LOCK: a second trainer of the folder is refused while this one lives, also one another tool started), and
    what killed writers left there is gone (temporaries of dead processes, checkpoints that never completed:
    each said in a warning)."""
    check_writable_dir(out, "out_dir")
    with pid_lock(out / LOCK, f"out_dir {out}"):
        for folder in (out, *ckpt.list_checkpoints(out)):
            remove_stale_temporaries(folder)
        for d in ckpt.remove_incomplete(out):
            warnings.warn(f"checkpoint {d} never completed (no {ckpt.META}: its write was cut short); removed it")
        yield


def restore(cfg: TrainConfig, out: Path, model: DepthPack, opt, sched, d: Dist) -> int:
    """The step this run starts from. A new run (resume=false) refuses a folder that holds checkpoints.
    resume=true loads the newest checkpoint that fits this run (model, optimizer, scheduler, RNG); each
    newer one that does not is one warning line; 0 when there is none; a checkpoint past cfg.steps is refused."""
    if not cfg.resume:
        existing = ckpt.list_checkpoints(out)
        if existing:
            raise ValueError(f"{out} already holds checkpoints ({existing[-1].name}); pass resume=true to continue "
                             f"it, or choose another out_dir")
        return 0
    mcfg = cfg.model_config()
    found = ckpt.latest_checkpoint(out, use=lambda cdir, blobs: _load(cdir, blobs, mcfg, model, opt, sched))
    if found is None:
        if d.main:
            print(f"resume: {out} holds no checkpoint yet; starting from step 0")
        return 0
    cdir, (step, world, stored) = found
    check_same_stream(cfg, stored, cdir)
    if step > cfg.steps:  # it would only rewrite summary.json, with nothing trained
        raise ValueError(f"resume: {cdir} is at step {step}, past steps={cfg.steps}: resume with steps >= {step}, or "
                         f"choose another out_dir")
    if d.main:
        if world not in (None, d.world):
            print(f"resume: world size {world} -> {d.world}; the data order after step {step} changes")
        print(f"resumed from {cdir} at step {step}")
    return step


# The keys a step's batch is drawn from (with the step): a resumed run replays the stream it started with, so
# a change of any is refused by name (the data set itself is not compared: data.root may move).
STREAM_KEYS = ("seed", "data.seed", "data.fresh", "data.device_cache")


def check_same_stream(cfg: TrainConfig, stored: dict[str, Any], cdir: Path) -> None:
    """One ValueError naming each STREAM_KEYS key whose value differs from the one checkpoint cdir trained with
    (stored: its config.json's "train"); a key it does not hold is not compared."""
    now, stored = dotted(to_dict(cfg)), dotted(stored)
    def said(v) -> str:  # as written in a config: true, null, 1
        return json.dumps(v, default=str)
    changed = [f"{key}={said(now[key])} (the run trained with {key}={said(stored[key])})" for key in STREAM_KEYS
               if key in stored and stored[key] != now[key]]
    if changed:
        raise ValueError(f"resume: {', '.join(changed)}: a resumed run continues the data stream of {cdir}; set it "
                         f"back, or train the change in another out_dir")


def _load(cdir: Path, blobs: dict[str, bytes], mcfg: ModelConfig, model: DepthPack, opt, sched) -> tuple[int, Any, dict]:
    """Checkpoint cdir into this run: (its step, its world size, the TrainConfig it stored); a CheckpointError
    if it is not of this run."""
    stored = json.loads(blobs[ckpt.CONFIG])
    want = to_dict(mcfg)
    have = to_dict(stored_model_config(stored["model"]))
    diff = [f"{k} {have.get(k)!r} (the config: {want.get(k)!r})" for k in sorted(set(want) | set(have))
            if k != "backbone_weights" and want.get(k) != have.get(k)]
    if diff:
        raise ckpt.CheckpointError(f"checkpoint {cdir} holds another model: {', '.join(diff)}")
    ckpt.load_weights(model, ckpt.load_weights_bytes(blobs[ckpt.WEIGHTS], cdir / ckpt.WEIGHTS), cdir / ckpt.WEIGHTS)
    state = ckpt.load_state_bytes(blobs[ckpt.STATE], cdir / ckpt.STATE)
    try:  # a state.pt that verifies but is not ours (another program, another version)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        return int(state["step"]), state.get("world_size"), stored.get("train", {})
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as e:
        raise ckpt.CheckpointError(f"{cdir / ckpt.STATE}: not the training state of this run "
                                   f"({type(e).__name__}: {e})") from None


def save(out: Path, step: int, model: DepthPack, opt, sched, cfg: TrainConfig, world: int) -> None:
    """A checkpoint of step: weights, optimizer, scheduler, RNG and the data position; the oldest beyond
    keep_checkpoints removed."""
    opt_state, sched_state = plain_lr_state(opt.state_dict(), sched.state_dict())
    state = {"step": step, "optimizer": opt_state, "scheduler": sched_state, "rng": ckpt.rng_state(),
             "world_size": world, "data": {"seed": cfg.seed, "position": step, "batch_size": cfg.batch_size}}
    stored = {"model": to_dict(cfg.model_config()), "train": to_dict(cfg)}
    ckpt.save_checkpoint(out, step, model, state, stored, keep=cfg.keep_checkpoints)


def saved(out: Path, step: int) -> bool:
    return ckpt.step_dir(out, step).is_dir()


def plain_lr_state(opt_state: dict, sched_state: dict) -> tuple[dict, dict]:
    """The optimizer's and scheduler's state dicts with every learning rate a float (as an eager run
    saves them), whatever the live optimizer holds; the live objects are not touched."""
    def plain(v):
        return float(v) if isinstance(v, torch.Tensor) else v

    opt_state = {**opt_state, "param_groups": [{k: plain(v) if k in ("lr", "initial_lr") else v for k, v in g.items()}
                                               for g in opt_state["param_groups"]]}
    sched_state = {k: [plain(x) for x in v] if k in ("base_lrs", "_last_lr") else v for k, v in sched_state.items()}
    return opt_state, sched_state


def resume_point(out: Path) -> str:
    """Where a run stopped now would resume from, in words (for the line Ctrl-C prints)."""
    try:
        step = json.loads((out / ckpt.LATEST).read_bytes())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{out} holds no complete checkpoint yet (resume=true starts from step 0)"
    return f"{out} keeps its checkpoints up to step {step} (resume=true continues from it)"


def untrained_checkpoint(config: str, out: Path, overrides: list[str] | None = None) -> Path:
    """The config's model, untrained (seeded), as a checkpoint in out: what a GPU run compiles into packages
    while training runs (the packages hold code, which depends on the model's shapes, not its weights)."""
    from .config import load_train_config

    cfg = load_train_config(config, overrides)
    torch.manual_seed(cfg.seed)
    mcfg = cfg.model_config()
    return ckpt.save_checkpoint(out, 0, DepthPack(mcfg), {}, {"model": to_dict(mcfg), "train": to_dict(cfg)})
