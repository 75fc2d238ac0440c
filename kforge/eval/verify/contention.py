"""Other work competing for the GPU while a candidate's call runs, so that its blocks are
scheduled otherwise than on an idle device.

A race between blocks through global memory (a block reading what another has not written yet,
a flag set before the data it guards is visible) is outside compute-sanitizer's racecheck, which
sees shared memory only, and on an idle GPU blocks often run in an order that hides it. The second
run of every verification set is made while a matrix product on another stream holds the SMs:
the candidate's blocks start as the product's leave room, in another order and at other times,
and the result must still match eager (and the precision rule) and the first run.
"""

from __future__ import annotations

from functools import cache
from types import TracebackType

import torch

# The competing product: SIZE x SIZE float32, about 0.3 ms on an H200 in tiles that fill its SMs
# for a few waves.
SIZE = 2048


class Contention:
    """A context manager: on entry, a matrix product is queued on a side stream to start with
    the next work of the current stream; on exit the current stream waits for it. Elsewhere than
    on CUDA it does nothing."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream: torch.cuda.Stream | None = None
        self.operands: tuple[torch.Tensor, torch.Tensor] | None = None

    def __enter__(self) -> Contention:
        if self.device.type != "cuda":
            return self
        if self.stream is None or self.operands is None:
            self.stream = torch.cuda.Stream(self.device)
            square = torch.randn(SIZE, SIZE, device=self.device)
            self.operands = (square, torch.empty_like(square))
        square, product = self.operands
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            torch.mm(square, square, out=product)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)


@cache
def contention_for(device: torch.device) -> Contention:
    """One ``Contention`` per device and process: its operands are made once."""
    return Contention(device)
