"""Building blocks shared by the model zoo: MLP, dot interaction, FM, cross network.

Every layer works on whatever device and float dtype its inputs live on; index
helpers are non-persistent buffers so ``.to(device)`` moves them and
``state_dict`` does not carry them.

>>> import torch
>>> from tierec.models.layers import MLP, DotInteraction, FactorizationMachine, CrossNetV2
>>> MLP(4, [8, 3])(torch.randn(2, 4)).shape
torch.Size([2, 3])
>>> DotInteraction(3)(torch.randn(2, 3, 5)).shape  # 3 * 2 / 2 pairs
torch.Size([2, 3])
>>> FactorizationMachine()(torch.randn(2, 3, 5)).shape
torch.Size([2])
>>> CrossNetV2(6, num_layers=2, rank=2)(torch.randn(2, 6)).shape
torch.Size([2, 6])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def init_linear(layer: nn.Linear, relu: bool) -> None:
    """He (Kaiming) uniform for a layer followed by ReLU, Xavier uniform otherwise; zero bias."""
    if relu:
        nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")
    else:
        nn.init.xavier_uniform_(layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


class MLP(nn.Module):
    """``Linear -> ReLU [-> Dropout]`` per entry of ``sizes``.

    With ``activate_last=False`` the last layer is a plain linear map (no ReLU,
    no dropout), as wanted for a projection or an output layer.
    """

    def __init__(self, in_dim: int, sizes: list[int], dropout: float = 0.0, activate_last: bool = True) -> None:
        super().__init__()
        if in_dim <= 0 or any(s <= 0 for s in sizes):
            raise ValueError(f"MLP sizes must be positive, got in_dim={in_dim}, sizes={sizes}")
        layers: list[nn.Module] = []
        dims = [in_dim, *sizes]
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            linear = nn.Linear(d_in, d_out)
            activated = activate_last or i < len(sizes) - 1
            init_linear(linear, relu=activated)
            layers.append(linear)
            if activated:
                layers.append(nn.ReLU())
                if dropout > 0:
                    layers.append(nn.Dropout(dropout))
        self.layers = nn.Sequential(*layers)
        self.out_dim = dims[-1]

    def forward(self, x: Tensor) -> Tensor:  # [B, in_dim] -> [B, out_dim]
        return self.layers(x)


def _columns(t: Tensor, index: Tensor) -> Tensor:
    """``t[:, index]`` for a 2-D ``t``, by ``gather``.

    ``index_select`` over columns is not vectorised for bfloat16: ``gather`` is
    4x faster there (backward 8.0 against 2.1 ms) and as fast in float32 (batch
    4096, 27 vectors of dim 16).
    """
    return torch.gather(t, 1, index.expand(t.shape[0], -1))


_HALF = (torch.bfloat16, torch.float16)
SELECT_MAX_FEATURES = 32  # up to this many vectors the backward's half-precision scatter is a matmul (below)


def _upper_triangle(gram: Tensor, pair_index: Tensor) -> Tensor:
    """The strict upper triangle of ``gram`` [B, N, N], row by row, as [B, N (N - 1) / 2].

    In half precision a concatenation of the rows' slices (0.9 against 1.7 ms by gather at batch 4096, 27
    vectors, bf16, one thread); in float32 the gather (1.1 against 1.2 ms). The same values either way."""
    if gram.dtype in _HALF:
        n = gram.shape[1]
        return torch.cat([gram[:, i, i + 1 :] for i in range(n - 1)], dim=1)
    return _columns(gram.flatten(1), pair_index)


class _PairDots(torch.autograd.Function):
    """Strict upper triangle of ``X X^T`` with a backward of one ``bmm``.

    Autograd's backward of ``bmm(x, x^T)`` then ``index_select`` scatters the
    output gradient into a zero Gram matrix (a ``scatter_add``) and runs two
    ``bmm``s, one per operand. The Gram matrix is symmetric, so the gradient
    of ``x`` is ``(G + G^T) x`` with ``G + G^T`` built from the output
    gradient in one step: a gather from it padded with a zero column, or in
    half precision with few vectors a product with a 0/1 matrix that puts each
    pair's gradient at (i, j) and (j, i) (each output sums one product by 1:
    the same values; 1.3 against 3.5 ms at batch 4096, 27 vectors, bf16, one
    thread). Together 0.7x the time of the autograd pair in float32.

    Under autocast (``torch.autocast``) the products run in the autocast dtype,
    as a ``bmm`` there would: the input is cast once, the cast copy is what is
    saved, the output is in that dtype, and the backward returns the gradient
    in the input's own dtype.
    """

    @staticmethod
    def forward(ctx, x: Tensor, pair_index: Tensor, sym_source: Tensor, pair_select: Tensor) -> Tensor:  # type: ignore[override]
        ctx.input_dtype = x.dtype
        device = x.device.type
        if torch.is_autocast_enabled(device) and x.is_floating_point():
            x = x.to(torch.get_autocast_dtype(device))
        ctx.save_for_backward(x, sym_source, pair_select)
        return _upper_triangle(torch.bmm(x, x.transpose(1, 2)), pair_index)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, sym_source, pair_select = ctx.saved_tensors
        b, n = x.shape[0], x.shape[1]
        grad = grad.to(x.dtype)
        if grad.dtype in _HALF and pair_select.numel():
            sym = (grad @ pair_select.to(grad.dtype)).view(b, n, n)  # G + G^T, zero diagonal
        else:
            padded = torch.cat([grad.new_zeros(b, 1), grad], dim=1)  # [B, 1 + P]: column 0 reads as zero
            sym = _columns(padded, sym_source).view(b, n, n)  # G + G^T, zero diagonal
        return torch.bmm(sym, x).to(ctx.input_dtype), None, None, None


class DotInteraction(nn.Module):
    """Pairwise dot products of ``N`` feature vectors, as in DLRM.

    Returns the strict upper triangle of ``X X^T`` in row-major order: pairs
    ``(0,1), (0,2), ..., (0,N-1), (1,2), ...`` -> ``[B, N (N - 1) / 2]``.
    """

    def __init__(self, num_features: int) -> None:
        super().__init__()
        if num_features < 2:
            raise ValueError(f"DotInteraction needs at least 2 features, got {num_features}")
        n = num_features
        rows, cols = torch.triu_indices(n, n, offset=1)
        # Linear positions into the flattened [N * N] Gram matrix.
        self.register_buffer("pair_index", rows * n + cols, persistent=False)
        # For the backward: entry (i, j) of the flattened Gram matrix reads the
        # gradient of pair (min(i,j), max(i,j)), at 1 + its pair number; 0 (a zero) on the diagonal.
        sym_source = torch.zeros(n * n, dtype=torch.long)
        pair = torch.arange(1, rows.numel() + 1)
        sym_source[rows * n + cols] = pair
        sym_source[cols * n + rows] = pair
        self.register_buffer("sym_source", sym_source, persistent=False)
        # The same in half precision: [P, N * N], a 1 at (p, i N + j) and (p, j N + i) of pair p = (i, j);
        # its cost grows as N^4, so only for few vectors (empty otherwise).
        select = torch.zeros((rows.numel(), n * n) if n <= SELECT_MAX_FEATURES else (0, 0), dtype=torch.bfloat16)
        if select.numel():
            p = torch.arange(rows.numel())
            select[p, rows * n + cols] = 1
            select[p, cols * n + rows] = 1
        self.register_buffer("pair_select", select, persistent=False)
        self.num_features = n

    @property
    def out_dim(self) -> int:
        return self.num_features * (self.num_features - 1) // 2

    def forward(self, x: Tensor) -> Tensor:  # [B, N, D] -> [B, N (N - 1) / 2]
        return _PairDots.apply(x, self.pair_index, self.sym_source, self.pair_select)


class FactorizationMachine(nn.Module):
    """Second-order FM term ``sum_{i<j} <v_i, v_j>`` in O(F D) per sample.

    Uses ``0.5 * sum_d((sum_f v_fd)^2 - sum_f v_fd^2)``; no parameters.
    """

    def forward(self, x: Tensor) -> Tensor:  # [B, F, D] -> [B]
        square_of_sum = x.sum(dim=1).square()  # [B, D]
        sum_of_square = x.square().sum(dim=1)  # [B, D]
        return 0.5 * (square_of_sum - sum_of_square).sum(dim=1)


class CrossLayer(nn.Module):
    """One DCN-v2 cross layer: ``x_{l+1} = x0 * (W x_l + b) + x_l``.

    ``rank == 0``: ``W`` is a full ``[d, d]`` matrix (``self.full``).
    ``rank > 0``: ``W = U V^T`` with ``U = self.up.weight`` (``[d, r]``) and
    ``V^T = self.down.weight`` (``[r, d]``); the bias ``b`` sits on ``self.up``.
    """

    def __init__(self, dim: int, rank: int = 0) -> None:
        super().__init__()
        if rank < 0:
            raise ValueError(f"cross rank must be >= 0, got {rank}")
        self.rank = rank
        if rank == 0:
            self.full = nn.Linear(dim, dim)
            init_linear(self.full, relu=False)
        else:
            self.down = nn.Linear(dim, rank, bias=False)
            self.up = nn.Linear(rank, dim)
            init_linear(self.down, relu=False)
            init_linear(self.up, relu=False)

    def forward(self, x0: Tensor, x: Tensor) -> Tensor:  # [B, d], [B, d] -> [B, d]
        projected = self.full(x) if self.rank == 0 else self.up(self.down(x))
        return x0 * projected + x


class CrossNetV2(nn.Module):
    """A stack of ``num_layers`` DCN-v2 cross layers over the input ``x0``."""

    def __init__(self, dim: int, num_layers: int, rank: int = 0) -> None:
        super().__init__()
        if num_layers < 0:
            raise ValueError(f"num_layers must be >= 0, got {num_layers}")
        self.layers = nn.ModuleList(CrossLayer(dim, rank) for _ in range(num_layers))

    def forward(self, x0: Tensor) -> Tensor:  # [B, d] -> [B, d]
        x = x0
        for layer in self.layers:
            x = layer(x0, x)
        return x
