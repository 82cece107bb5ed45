"""What a run records: log.csv and eval.csv (RunLog, + TensorBoard and a progress bar), and what it
measures (Meter: the loss over each log window, and where a step's time goes)."""
from __future__ import annotations

import csv
import io
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from ..core.files import atomic_write_text
from .batches import Batch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RunLog:
    """CSV rows on rank 0 (+ TensorBoard where installed, + a tqdm bar with progress=True).

    Rows are appended (a kill can cut at most the last row short), and every row of a step, the last
    evaluation's included, is written before that step's checkpoint: a kill never leaves a checkpoint
    whose rows are missing. On resume, log.csv and eval.csv keep their rows up to the resumed step and
    are rewritten atomically; rows that do not parse (a cut-short last row, garbage) are dropped with
    a warning naming the file and line.
    """

    def __init__(self, out_dir: Path, start_step: int, enabled: bool, steps: int = 0, progress: bool = False):
        self.enabled = enabled
        self.path = out_dir / "log.csv"
        self.eval_path = out_dir / "eval.csv"
        self.tb = self.bar = None
        self._fields: dict[Path, list[str]] = {}  # each CSV's header, read once: not on every row
        if not enabled:
            return
        for path in (self.path, self.eval_path):
            if path.is_file():
                self._truncate(path, start_step)
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(out_dir / "tb"))
        except Exception:  # tensorboard is optional
            pass
        if progress:
            from tqdm import tqdm
            self.bar = tqdm(total=steps, initial=start_step, desc="train", dynamic_ncols=True)

    @staticmethod
    def _truncate(path: Path, start_step: int) -> None:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = reader.fieldnames, []
            for line, r in enumerate(reader, 2):
                try:
                    step = int(r["step"])
                    if None in r or any(v is None for v in r.values()):
                        raise ValueError("wrong number of columns")
                except (TypeError, ValueError, KeyError) as e:
                    warnings.warn(f"{path}:{line}: dropping a row that does not parse ({e})")
                    continue
                if step <= start_step:
                    rows.append(r)
        buf = io.StringIO()
        if rows and fields:
            w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        atomic_write_text(path, buf.getvalue())

    def logged(self, step: int, eval_row: bool = False) -> dict[str, float] | None:
        """The row of `step` in log.csv (eval.csv) as numbers; None where there is none."""
        path = self.eval_path if eval_row else self.path
        if not self.enabled or not path.is_file():
            return None
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r.get("step") == str(step):
                    try:
                        return {k: float(v) for k, v in r.items() if k != "step" and v != ""}
                    except (TypeError, ValueError):
                        return None
        return None

    def _header(self, path: Path, row: dict[str, Any]) -> list[str]:
        """The columns of path's rows: its header, with row's new columns joined (a run resumed across a change
        of the columns: the old rows are rewritten under the wider header, no value dropped)."""
        fields = list(row)
        if path.is_file() and path.stat().st_size > 0:
            with open(path, newline="") as f:
                header = next(csv.reader(f), [])
            fields = header if set(row) <= set(header) else fields + [h for h in header if h not in row]
            if fields != header:
                with open(path, newline="") as f:
                    old = list(csv.DictReader(f))
                buf = io.StringIO()
                w = csv.DictWriter(buf, fieldnames=fields, restval="", lineterminator="\n")
                w.writeheader()
                w.writerows(old)
                atomic_write_text(path, buf.getvalue())
        return fields

    def _append(self, path: Path, row: dict[str, Any]) -> None:
        fields = self._fields.get(path)
        if fields is None or not set(row) <= set(fields):
            fields = self._fields[path] = self._header(path, row)
        new = not path.is_file() or path.stat().st_size == 0
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, restval="", lineterminator="\n")
            if new:
                w.writeheader()
            w.writerow(row)

    def log(self, row: dict[str, Any], eval_row: bool = False) -> None:
        if not self.enabled:
            return
        self._append(self.eval_path if eval_row else self.path, row)
        if self.tb is not None:
            prefix = "val/" if eval_row else "train/"
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(prefix + k, v, row["step"])
        if self.bar is not None and not eval_row:
            self.bar.set_postfix(loss=f"{row['loss']:.4f}", img_s=f"{row['imgs_per_s']:.1f}", q=row["q"])

    def step_done(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        for w in (self.bar, self.tb):
            if w is not None:
                w.close()
        self.bar = self.tb = None


class Meter:
    """The loss terms' mean over each log window, and where a step's time goes: data (the batch made and
    on the device) and compute (forward, backward, optimizer). On CUDA it reads events on the device's
    clock, only at log rows (no sync per step); elsewhere the host's clock. Logging, validation and
    checkpoints fall between steps and count in neither. Each bucket's first step (its compile, with
    cfg.compile) is timed on its own, synced, and left out of the totals, as are the steps up to `skip`."""

    def __init__(self, device: torch.device, images_per_step: int, skip: int):
        self.device, self.cuda, self.images_per_step, self.skip = device, device.type == "cuda", images_per_step, skip
        self.marks: list[tuple] = []
        self.total = [0.0, 0.0, 0]  # data s, compute s, steps (timed ones)
        self.first_step_s: dict[int, float] = {}  # bucket -> seconds of its first step
        self.sums, self.n, self.names, self.last = None, 0, (), {}
        self.t0 = self.t_window = time.perf_counter()
        self.start = self._mark()

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def data_ready(self, b: Batch) -> None:
        self.first = b.bucket not in self.first_step_s
        if self.first:
            sync(self.device)
            self.t_first = time.perf_counter()
        self.data = self._mark()

    def step_done(self, b: Batch, loss: torch.Tensor, terms: dict[str, torch.Tensor]) -> None:
        self.marks.append((self.start, self.data, self._mark(), not self.first and b.step > self.skip))
        if self.first:
            sync(self.device)
            self.first_step_s[b.bucket] = round(time.perf_counter() - self.t_first, 3)
        values = torch.stack([loss.detach(), *terms.values()]).float()  # no host sync until the log row
        self.sums = values if self.sums is None else self.sums + values
        self.names, self.n = ("loss", *terms), self.n + 1

    def next_step(self) -> None:
        self.start = self._mark()

    def row(self, b: Batch, lr: float, grad_norm: torch.Tensor) -> dict[str, Any]:
        """The log row of step b.step: the window's mean loss terms (not one noisy step), and its timings."""
        self.last = dict(zip(self.names, (self.sums / self.n).tolist()))
        data_ms, compute_ms = self.window()
        now = time.perf_counter()
        row = dict(step=b.step, **{k: round(v, 6) for k, v in self.last.items()}, lr=float(lr), q=b.q, bucket=b.bucket,
                   grad_norm=round(float(grad_norm), 4),
                   imgs_per_s=round(self.n * self.images_per_step / max(now - self.t_window, 1e-9), 2),
                   elapsed_s=round(now - self.t0, 2), data_ms=round(data_ms, 3), compute_ms=round(compute_ms, 3))
        self.t_window, self.sums, self.n = now, None, 0
        return row

    def window(self) -> tuple[float, float]:
        """Mean data and compute ms per step since the last call (and the timed ones into the totals)."""
        if not self.marks:
            return float("nan"), float("nan")
        if self.cuda:
            self.marks[-1][2].synchronize()
        sd = sc = 0.0
        for a, b, c, timed in self.marks:
            ds, cs = self._seconds(a, b), self._seconds(b, c)
            sd, sc = sd + ds, sc + cs
            if timed:
                self.total[0] += ds
                self.total[1] += cs
                self.total[2] += 1
        n = len(self.marks)
        self.marks.clear()
        return 1e3 * sd / n, 1e3 * sc / n

    def summary(self, steps: int, wall: float, **extra) -> dict[str, Any]:
        """The run's throughput: per timed step, and over the wall time of `steps` steps."""
        self.window()  # the last steps into the totals
        d, c, n = self.total
        out: dict[str, Any] = {"timed_steps": n, "clock": "cuda events" if self.cuda else "host"}
        if n:
            per = (d + c) / n
            out.update(imgs_per_s=round(self.images_per_step / per, 1), step_ms=round(1e3 * per, 3),
                       data_ms=round(1e3 * d / n, 3), compute_ms=round(1e3 * c / n, 3), data_share=round(d / (d + c), 4))
        out.update(wall_imgs_per_s=round(self.images_per_step * steps / max(wall, 1e-9), 1),
                   first_step_s=self.first_step_s, **extra)
        return out
