"""Reading checkpoint data straight onto an accelerator, through two pinned host buffers that take turns: one is
read into and hashed while the other's copy to the device runs. No fresh host memory is touched (first-touching
gigabytes of host pages, as a restore into CPU tensors does, costs more than the read on a VM or a fresh node),
and the device copy is not the pageable one ``load_state_dict`` would make from CPU tensors."""
from __future__ import annotations

import os

import torch
import xxhash

_BUFFER = 1 << 25            # bytes per staging buffer (two of them)


class DeviceStaging:
    """Two staging buffers (pinned where CUDA is), reused for every dataset of one load; ``piece``: bytes read and
    hashed at a time (while still in cache, as for reads into host memory)."""

    def __init__(self, piece: int) -> None:
        self.piece = piece
        pin = torch.cuda.is_available()
        self.buffers = [torch.empty(_BUFFER, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self.copies: list[torch.cuda.Event | None] = [None, None]     # each buffer's last copy to the device
        self.turn = 0

    def read(self, fd: int, offset: int, dest: torch.Tensor) -> str | None:
        """Read ``dest``'s bytes (a fresh contiguous tensor on any device) from ``fd`` at ``offset``: their xxh3
        digest, None when the file ends first."""
        flat = dest.reshape(-1).view(torch.uint8)
        h = xxhash.xxh3_64()
        for start in range(0, flat.numel(), _BUFFER):
            n = min(_BUFFER, flat.numel() - start)
            buf, pending = self.buffers[self.turn], self.copies[self.turn]
            if pending is not None:
                pending.synchronize()            # its last copy has left it
            view = buf.numpy().data[:n]
            for pos in range(0, n, self.piece):
                piece = view[pos:pos + self.piece]
                if os.preadv(fd, [piece], offset + start + pos) != len(piece):
                    return None
                h.update(piece)
            flat[start:start + n].copy_(buf[:n], non_blocking=flat.is_cuda)
            if flat.is_cuda:
                ev = torch.cuda.Event()   # type: ignore[no-untyped-call]
                ev.record()
                self.copies[self.turn] = ev
            self.turn ^= 1
        return h.hexdigest()

    def finish(self) -> None:
        """Wait for the last copies: the tensors are complete on every stream, and the buffers may go."""
        for ev in self.copies:
            if ev is not None:
                ev.synchronize()
