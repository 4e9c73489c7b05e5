"""On-device sampling: logits in, token ids out, inside the compiled graph.

Per row: temperature 0 is greedy; otherwise logits are divided by the temperature, cut to the top-k
(``top_k <= 0`` keeps all) and to the smallest nucleus whose probability reaches ``top_p``, and a token
is drawn by the Gumbel-max trick with noise the caller supplies. Drawing the noise outside the graph
from a per-request seeded generator keeps sampling reproducible and independent of batching.
"""

from __future__ import annotations

import torch

from .dispatch import kernel_op


def gumbel_noise(vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    """Standard Gumbel noise ``[vocab_size]``: argmax(logits + noise) samples softmax(logits)."""
    u = torch.rand(vocab_size, generator=generator, dtype=torch.float32).clamp_(min=1e-20, max=1.0 - 1e-7)
    return -torch.log(-torch.log(u))


@kernel_op("sample")
def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    """``logits [N, V]`` (float32), per-row ``temperature``/``top_k``/``top_p`` ``[N]``, ``noise [N, V]``
    → token ids ``[N]`` (int64)."""
    greedy = logits.argmax(dim=-1)
    vocab = logits.shape[-1]
    scaled = logits / torch.where(temperature > 0, temperature, 1.0)[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    keep = rank < k
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    # A token stays in the nucleus if the mass before it is still short of top_p (the first always stays).
    keep = keep & ((probs.cumsum(dim=-1) - probs) < top_p[:, None])
    masked = torch.full_like(scaled, float("-inf")).scatter(
        -1, order, sorted_logits.masked_fill(~keep, float("-inf"))
    )
    sampled = (masked + noise).argmax(dim=-1)
    return torch.where(temperature > 0, sampled, greedy)
