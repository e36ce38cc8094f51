"""The planted model behind the synthetic labels, and the id permutation it shares.

logit = bias + sum_j w_j (d_j - m_j)                      dense, linear
              + sum_f a_f mean_{id in bag f} h(r) e_f(id)   one effect per id
              + sum_{(p, q)} b_pq <U_p, U_q>                 low-rank pairwise term

* ``e_f(id)`` is a pseudo-normal number hashed from (seed, feature, id) and
  ``U_f`` the bag mean of ``h(r) u_f(id)``, ``u_f(id)`` a 4-d vector of hashed
  unit-variance numbers: nothing is tabulated, every value is recomputed.
* ``r`` is the id's popularity rank (0 = hottest), recovered from the id by
  inverting the feature's 32-bit permutation; ``h(r) = R0 / (R0 + r)`` fades the
  effect of rare ids, which a trainer sees too seldom to learn, so a model trained
  on about a million rows can come close to the planted AUC.
* The weights are scaled so the logit has standard deviation ``LOGIT_STD``:
  20% of its variance from dense features, 60% from per-id effects and 20% from
  interactions. Feature ``f`` gets a share ``0.7 ** k_f`` of the per-id part, with
  ``k_f`` a seeded permutation of 0..25, so the features' variance shares span
  four orders of magnitude and several features are close to useless (for
  pruning studies).
  The bias is fitted on a separate calibration stream so the mean click
  probability is ``positive_rate``.

The logit is a function of the Batch only (dense values and ids), so
:meth:`PlantedModel.logits` scores any batch of synthetic ids, e.g. read back
from shards.

>>> from tierec.config import SyntheticConfig
>>> m = PlantedModel.from_config(SyntheticConfig())
>>> dense, values, _ = m.draw(seeded(0, 100, 1), start=0, n=3)
>>> m.logits(dense, values, np.arange(26 * 3 + 1)).shape
(3,)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from tierec.config import SyntheticConfig
from tierec.data.schema import CRITEO_CARDINALITIES
from tierec.data.synth_kernels import LATENT_DIM, draw_kernel, pseudo_normal, rank_table, score_kernel

LOGIT_STD = 1.6  # standard deviation of the planted logit (planted AUC about 0.82)
DECAY_RANK = 200.0  # R0: an id's effect is scaled by R0 / (R0 + rank)
N_INTERACTING = 4  # features carrying latent vectors (all pairs among them interact)
SHARES = (0.2, 0.6, 0.2)  # variance of the logit from dense, per-id effects, interactions
IMPORTANCE_RATIO = 0.7  # successive features' shares of the per-id variance
CALIBRATION_ROWS = 1 << 14  # rows of the stream the bias is fitted on (base rate within ~0.003)
CALIBRATION_SPLIT = 3  # the stream's tag (train is 1, test 2)

def seeded(seed: int, *tags: int) -> np.uint64:
    """A uint64 derived from the seed and a path of integer tags (pure Python, exact)."""
    mask, golden = (1 << 64) - 1, 0x9E3779B97F4A7C15

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    h = mix((seed + golden) & mask)
    for t in tags:
        h = mix(h ^ mix((t + golden) & mask))
    return np.uint64(h)


def cardinalities(cfg: SyntheticConfig) -> tuple[int, ...]:
    """Ids per feature: the Criteo Kaggle counts scaled by ``cardinality_scale`` (at least 2)."""
    return tuple(max(2, round(c * cfg.cardinality_scale)) for c in CRITEO_CARDINALITIES)


def rank_probabilities(n: int, zipf: float, limit: int = 1 << 16) -> np.ndarray:
    """P(rank = r) of the sampler, for r < min(n, limit)."""
    r = np.arange(min(n, limit), dtype=np.float64)
    if zipf == 0.0:
        return np.full(r.shape, 1.0 / n)
    if abs(zipf - 1.0) < 1e-9:
        return (np.log(r + 2.0) - np.log(r + 1.0)) / math.log(n + 1.0)
    a = 1.0 - zipf
    return ((r + 2.0) ** a - (r + 1.0) ** a) / ((n + 1.0) ** a - 1.0)


@dataclass(frozen=True)
class PlantedModel:
    """All constants of the planted model; a pure function of the SyntheticConfig."""

    cards: np.ndarray  # [F] int64
    perm_keys: np.ndarray  # [F, 2] uint64, 32-bit keys of each feature's permutation
    effect_keys: np.ndarray  # [F] uint64
    latent_keys: np.ndarray  # [F] uint64
    weights: np.ndarray  # [F] float64, a_f
    latent_slot: np.ndarray  # [F] int64, row of U for interacting features, else -1
    pairs: np.ndarray  # [P, 2] int64, latent slots that interact
    pair_weights: np.ndarray  # [P] float64
    dense_scale: np.ndarray  # [D] float64, d_j = scale_j * |z|
    dense_weights: np.ndarray  # [D] float64
    dense_mean: np.ndarray  # [D] float64
    bias: float
    importance: np.ndarray  # [F] float64, std of each feature's logit terms (interactions shared out)
    ids_per_feature: int
    zipf_mode: int  # 0 uniform, 1 exponent 1, 2 other exponents
    zipf_c: np.ndarray  # [F] float64, per-feature constant of the inverse CDF
    zipf_inv: float  # 1 / (1 - exponent) for mode 2
    rank_table: np.ndarray  # [F, RANK_BINS + 1] int32, ranks at quantile bin edges (see synth_kernels)
    decay_rank: float  # R0

    @staticmethod
    def from_config(cfg: SyntheticConfig) -> PlantedModel:
        """The model of ``cfg``; constants come from :func:`seeded`, not numpy's RNG (whose streams may change)."""
        n_feat, n_dense, seed = len(CRITEO_CARDINALITIES), cfg.n_dense, cfg.seed
        cards = np.array(cardinalities(cfg), np.int64)
        keys = np.array([[int(seeded(seed, 1, f, t)) & 0xFFFFFFFF for t in (0, 1)] for f in range(n_feat)], np.uint64)
        effect_keys = np.array([seeded(seed, 2, f) for f in range(n_feat)], np.uint64)
        latent_keys = np.array([seeded(seed, 3, f) for f in range(n_feat)], np.uint64)
        k = cfg.ids_per_feature
        # Per-id part: feature f's term a_f * E_f has variance share_f * 0.6 * LOGIT_STD**2.
        h2 = np.array([_mean_decay_sq(int(c), cfg.zipf) for c in cards])  # E[h(r)^2]
        order = np.argsort(np.argsort(_uniforms(seed, 4, n_feat)))  # importance rank of each feature
        share = IMPORTANCE_RATIO ** order.astype(np.float64)
        share /= share.sum()
        var_e = h2 / k  # Var(E_f): a bag mean of k independent effects
        importance = LOGIT_STD * np.sqrt(SHARES[1] * share)
        weights = importance / np.sqrt(var_e)
        # Interactions among the N_INTERACTING most important features with >= 8 ids, so the
        # unimportant features stay unimportant.
        by_importance = np.argsort(order).tolist()
        candidates = [f for f in by_importance if cards[f] >= 8] or by_importance
        inter = sorted(candidates[:N_INTERACTING])
        latent_slot = np.full(n_feat, -1, np.int64)
        latent_slot[inter] = np.arange(len(inter))
        pairs = np.array([(a, b) for a in range(len(inter)) for b in range(a + 1, len(inter))], np.int64).reshape(-1, 2)
        pair_std = np.array([math.sqrt(LATENT_DIM * h2[inter[a]] * h2[inter[b]]) / k for a, b in pairs])
        pair_weights = LOGIT_STD * math.sqrt(SHARES[2] / max(len(pairs), 1)) / pair_std
        importance[inter] = np.sqrt(importance[inter] ** 2 + LOGIT_STD**2 * SHARES[2] / len(inter))
        # Dense part: d_j = scale_j * |z| (half-normal), weights of random sign.
        dense_scale = 0.5 + 1.5 * _uniforms(seed, 6, n_dense)
        dense_mean = dense_scale * math.sqrt(2.0 / math.pi)
        dense_var = dense_scale**2 * (1.0 - 2.0 / math.pi)
        raw = np.array([pseudo_normal(seeded(seed, 7, j)) for j in range(n_dense)])
        dense_weights = raw * LOGIT_STD * math.sqrt(SHARES[0] / max(float((raw**2 * dense_var).sum()), 1e-12))
        # Ranks: x = (1 + u * c)^(1 / (1 - s)) is a power law on [1, n + 1); rank = floor(x) - 1.
        s = cfg.zipf
        if s == 0.0:
            mode, zc, inv = 0, cards.astype(np.float64), 0.0
        elif abs(s - 1.0) < 1e-9:
            mode, zc, inv = 1, np.log(cards + 1.0), 0.0
        else:
            mode, zc, inv = 2, (cards + 1.0) ** (1.0 - s) - 1.0, 1.0 / (1.0 - s)
        model = PlantedModel(
            cards, keys, effect_keys, latent_keys, weights, latent_slot, pairs, pair_weights,
            dense_scale, dense_weights, dense_mean, 0.0, importance, k, mode, zc, inv,
            rank_table(cards, zc, inv, mode), DECAY_RANK,
        )  # fmt: skip
        return dataclasses.replace(model, bias=model._calibrated_bias(cfg.seed, cfg.positive_rate))

    def draw(self, split_key: np.uint64, start: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows ``start..start+n-1`` of a stream: dense [n, D] float32, ids [F * n * k]
        int64 (feature-major, k = ids_per_feature) and the label uniforms [n] float64."""
        k, n_feat = self.ids_per_feature, self.cards.shape[0]
        dense = np.empty((n, self.dense_scale.shape[0]), np.float32)
        values = np.empty(n_feat * n * k, np.int64)
        u_label = np.empty(n, np.float64)
        draw_kernel(
            np.int64(start), split_key, self.cards, self.zipf_c, self.zipf_inv, self.zipf_mode, self.rank_table,
            self.perm_keys, k, self.dense_scale, dense, values, u_label,
        )  # fmt: skip
        return dense, values, u_label

    def _calibrated_bias(self, seed: int, rate: float) -> float:
        """The bias giving a mean click probability of ``rate`` on a calibration stream."""
        n, k = CALIBRATION_ROWS, self.ids_per_feature
        dense, values, _ = self.draw(seeded(seed, 100, CALIBRATION_SPLIT), 0, n)
        z = self.logits(dense, values, np.arange(0, self.cards.shape[0] * n * k + 1, k)).astype(np.float64)
        lo, hi = -30.0, 30.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if float(np.mean(1.0 / (1.0 + np.exp(-(mid + z))))) < rate:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    def logits(self, dense: np.ndarray, values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Planted logits [n] float32 of rows given ``dense`` [n, D] and feature-major bags."""
        out = np.empty(dense.shape[0], np.float32)
        score_kernel(
            dense, values, offsets, self.perm_keys, self.effect_keys, self.latent_keys, self.weights,
            self.latent_slot, self.pairs, self.pair_weights, self.dense_weights, self.dense_mean, self.bias,
            self.decay_rank, out,
        )  # fmt: skip
        return out


def _uniforms(seed: int, tag: int, n: int) -> np.ndarray:
    """``n`` numbers in [0, 1) from the seed (stable across numpy versions)."""
    return np.array([float(seeded(seed, tag, i) >> np.uint64(11)) / 2.0**53 for i in range(n)])


def _mean_decay_sq(n: int, zipf: float) -> float:
    p = rank_probabilities(n, zipf)
    h = DECAY_RANK / (DECAY_RANK + np.arange(p.shape[0], dtype=np.float64))
    return float((p * h * h).sum())
