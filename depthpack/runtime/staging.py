"""Staging: a fixed device buffer per static input of a captured graph, and its pinned host mirror, so a
call copies host data in asynchronously and allocates nothing."""
from __future__ import annotations

import torch


class Staged:
    """A device buffer and, for a CUDA device, its pinned host mirror (made once): host data is
    copied into the mirror, then asynchronously to the device; an event guards the mirror's reuse."""

    def __init__(self, shape, dtype, device: torch.device):
        self.dev = torch.zeros(shape, dtype=dtype, device=device)
        self.host = torch.zeros(shape, dtype=dtype, pin_memory=True) if device.type == "cuda" else None
        self.done = torch.cuda.Event() if device.type == "cuda" else None

    def wait(self) -> None:
        """Until the previous upload from the mirror has left it (no wait once it has: the usual case)."""
        if not self.done.query():
            self.done.synchronize()

    def load(self, src, rows: int) -> None:
        """dev[:rows] <- src: a tensor or a list of rows, on any device, any strides."""
        on_host = (src[0] if isinstance(src, list) else src).device.type == "cpu"
        if self.host is None or not on_host:
            copy_rows(self.dev, src, rows)
            return
        self.wait()
        copy_rows(self.host, src, rows)
        self.dev[:rows].copy_(self.host[:rows], non_blocking=True)
        self.done.record()

    def load_points(self, chunk: torch.Tensor, rows: int) -> torch.Tensor:
        """points [rows,q,2] -> dev[:rows] padded to the bucket with each row's first point (packing's
        pad_points rule, written in place); returns the staged [rows,q] points for checking."""
        q = chunk.shape[1]
        buf = self.dev if self.host is None or chunk.device.type != "cpu" else self.host
        if buf is self.host:
            self.wait()
        buf[:rows, :q].copy_(chunk)
        if q < buf.shape[1]:
            buf[:rows, q:].copy_(buf[:rows, :1].expand(rows, buf.shape[1] - q, 2))
        if buf is self.host:
            self.dev[:rows].copy_(self.host[:rows], non_blocking=True)
            self.done.record()
        return buf[:rows, :q]


def copy_rows(dst: torch.Tensor, src, rows: int) -> None:
    if isinstance(src, list):
        for i, row in enumerate(src):
            dst[i].copy_(row, non_blocking=True)
    else:
        dst[:rows].copy_(src, non_blocking=True)
