"""Collectives that put tensors where their group's backend wants them, and bring the results back.

The job's code builds host tensors for ids, counts and metrics, and may hold
rows and gradients on the GPU; gloo reads host memory and NCCL device memory.
Every collective of tierec/distributed goes through these few functions, which
copy a tensor to its group's device (``wire_device``: the current CUDA device
for an NCCL group, the host otherwise) when it is not there, and the result
back to the caller's tensor. On the CPU (gloo) nothing is copied.

``all_to_all`` here is ``all_to_all_single`` with row splits; its result (an
``Exchange``, possibly still in flight) lands on the device of the tensor sent:
``out`` at once for a blocking one, ``wait()`` for one in flight.

>>> import torch
>>> from tierec.distributed.wire import all_to_all, wire_device
>>> wire_device(None)   # no group (one process): the host
device(type='cpu')
>>> all_to_all(torch.arange(3), [3], [3], None).wait().tolist()   # one process: the tensor sent itself
[0, 1, 2]
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import Tensor


def wire_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where a collective on ``group`` reads and writes: the current CUDA device for NCCL, else the host."""
    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _on(t: Tensor, device: torch.device) -> Tensor:
    return t.contiguous() if t.device == device else t.to(device).contiguous()


def all_reduce(t: Tensor, group: dist.ProcessGroup | None, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> Tensor:
    """``t`` reduced over ``group``, in place (also when it travels through another device); returns ``t``."""
    w = _on(t, wire_device(group))
    dist.all_reduce(w, op=op, group=group)
    if w is not t:
        t.copy_(w)
    return t


def all_gather_single(out: Tensor, t: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """Every rank's ``t`` into ``out`` ([W * n, ...], rank order); returns ``out``."""
    dev = wire_device(group)
    w = _on(out, dev)
    dist.all_gather_into_tensor(w, _on(t, dev), group=group)
    if w is not out:
        out.copy_(w)
    return out


def broadcast(t: Tensor, src: int, group: dist.ProcessGroup | None) -> Tensor:
    """``t`` of global rank ``src`` on every rank of ``group``, in place; returns ``t``."""
    w = _on(t, wire_device(group))
    dist.broadcast(w, src=src, group=group)
    if w is not t:
        t.copy_(w)
    return t


class Exchange:
    """One all-to-all on a group, possibly in flight: ``wait()`` returns the output."""

    def __init__(self, out: Tensor, handle: dist.Work | None, home: torch.device | None = None) -> None:
        self.out = out
        self._handle = handle
        self._home = home  # the device the caller's tensors live on, when the wire's is another

    def wait(self, traffic=None, kind: str = "") -> Tensor:
        """The output (on the device of the tensor sent); ``traffic.add(kind, seconds=...)`` counts the wait."""
        if self._handle is not None:
            t0 = time.perf_counter()
            self._handle.wait()
            self._handle = None
            if traffic is not None:
                traffic.add(kind, seconds=time.perf_counter() - t0)
        if self._home is not None:
            self.out, self._home = self.out.to(self._home), None
        return self.out


def all_to_all(
    send: Tensor,  # [sum(send_splits), ...]
    send_splits: list[int],
    recv_splits: list[int],
    group: dist.ProcessGroup | None,
    *,
    async_op: bool = False,
) -> Exchange:
    """``all_to_all_single`` with row splits; one process (no group) returns ``send`` itself."""
    if group is None:
        return Exchange(send, None)
    dev = wire_device(group)
    out = torch.empty((sum(recv_splits), *send.shape[1:]), dtype=send.dtype, device=dev)
    handle = dist.all_to_all_single(out, _on(send, dev), recv_splits, send_splits, group=group, async_op=async_op)
    home = send.device if send.device != dev else None
    if not async_op:  # done: ``out`` is already on the device of the tensor sent
        return Exchange(out if home is None else out.to(home), None)
    return Exchange(out, handle, home=home)
