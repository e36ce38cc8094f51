"""A software prefetch for numba kernels: ``prefetch_row(a, r)`` asks the CPU to start
loading row ``r`` of a C-contiguous array into cache, without waiting for it.

The gather loops (pooling, the optimizer pass) read rows at random; a hardware
prefetcher cannot guess the next one, so each row is a cache miss paid in full.
Announcing the row a few ids ahead overlaps those misses. ``llvm.prefetch``
compiles to ``prefetcht0`` on x86 and to the matching hint elsewhere; it never
faults, so a row number past the end is harmless (callers still pass valid ones).

>>> import numba as nb, numpy as np
>>> @nb.njit
... def total(a, rows):
...     s = 0.0
...     for i in range(rows.shape[0]):
...         if i + 1 < rows.shape[0]:
...             prefetch_row(a, rows[i + 1])
...         s += a[rows[i], 0]
...     return s
>>> float(total(np.arange(6.0).reshape(3, 2), np.array([2, 0])))
4.0
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _emit_prefetch(builder, addr) -> None:
    """``llvm.prefetch(addr, read, high locality, data cache)``."""
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    ptr = builder.inttoptr(addr, i8p)
    builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


# How many ids ahead the gather loops announce a row: A/B on the engine step (26 x 1M rows,
# dim 16, Zipf 1.1, one-hot, forward + row-wise Adagrad prefetched): 4 ahead 1.08x, 8 ahead
# 1.13x, 16 ahead 1.13x on one thread; 16 ahead 1.09x on two (docs/performance.md).
AHEAD = 16


@intrinsic
def prefetch_row(typingctx, arr, row):
    """Prefetch (for reading, high locality) the first cache line of ``arr[row]``."""
    if not isinstance(arr, types.Array) or not isinstance(row, types.Integer):
        return None
    sig = types.void(arr, row)

    def codegen(context, builder, signature, args):
        aryty, _ = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        stride = builder.extract_value(ary.strides, 0)  # bytes between rows
        r = args[1]
        if r.type.width < stride.type.width:
            r = builder.sext(r, stride.type) if signature.args[1].signed else builder.zext(r, stride.type)
        offset = builder.mul(r, stride)
        base = builder.ptrtoint(ary.data, stride.type)
        _emit_prefetch(builder, builder.add(base, offset))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch_at(typingctx, arr, i, j):
    """Prefetch the cache line of ``arr[i, j]`` (the first two axes of an array of 2+ dims)."""
    if not isinstance(arr, types.Array) or arr.ndim < 2:
        return None
    if not (isinstance(i, types.Integer) and isinstance(j, types.Integer)):
        return None
    sig = types.void(arr, i, j)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        addr = builder.ptrtoint(ary.data, ir.IntType(64))
        for axis, (value, ty) in enumerate(zip(args[1:], signature.args[1:])):
            stride = builder.extract_value(ary.strides, axis)
            if value.type.width < stride.type.width:
                value = builder.sext(value, stride.type) if ty.signed else builder.zext(value, stride.type)
            addr = builder.add(addr, builder.mul(value, stride))
        _emit_prefetch(builder, addr)
        return context.get_dummy_value()

    return sig, codegen
