"""SeaKR (Yao et al. 2024, arXiv 2406.19215): EigenScore over k sampled continuations' hidden states.

Pinned to THU-KEG/SeaKR at commit d75fe707d22df4798794a8a8ae0040764e32b0d7: `eigen_score` is
`LLMEngine._compute_eigen_score` of their vLLM fork (vllm_uncertainty/vllm/engine/llm_engine.py), held to
its numbers by tests/test_peers.py. Their sampling (temperature 1.0, top_k 50, top_p 0.9, k = 20) and
threshold (-6.0, retrieve when the score is above it) are their SeaKR class defaults.

The embedding per sample: their fork stores, at the end token, the output of decoder layer 15
(`selected_intermediate_layer`, of 32 in Llama-2-7B: the middle), the block's output before vLLM adds the
residual stream back. transformers gives the residual stream after each layer, not that part; we take the
middle layer's hidden state at the last token, and say so in every report.
"""

from __future__ import annotations

import numpy as np

EIGEN_ALPHA = 1e-3  # eigen_alpha, their default
EIGEN_THRESHOLD = -6.0  # eigen_threshold, their default (retrieve when the score is higher)
SAMPLES = 20  # n of their sampling parameters
TOP_K, TOP_P, TEMPERATURE = 50, 0.9, 1.0


def eigen_score(z: np.ndarray, alpha: float = EIGEN_ALPHA) -> float:
    """(1/k) log det(Z J_d Z^T + alpha I_k) for k embeddings of width d (rows of `z`), J_d centring the
    features. NaN where the matrix has a negative determinant, as torch.logdet gives."""
    z = np.asarray(z, dtype=np.float32)
    k, d = z.shape
    centring = np.eye(d, dtype=np.float32) - np.float32(1 / d) * np.ones((d, d), dtype=np.float32)
    sigma = z @ centring @ z.T
    sign, logdet = np.linalg.slogdet(sigma.astype(np.float64) + alpha * np.eye(k))
    if sign < 0:
        return float("nan")
    return float(logdet / k) if sign > 0 else float("-inf")
