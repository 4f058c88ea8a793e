"""Lossless speculative sampling (temperature > 0) for chains and trees.

Terms, used once here for all of specbench: a draft token is *accepted* when the verifier keeps it; the
first draft token it does not keep is *rejected* and replaced by a *recovered* token drawn from the residual
distribution; when every draft token on the path is accepted, the *bonus* token is drawn from the target's
distribution after the last one. Either way a step ends with exactly one token the target chose itself,
counted with the accepted ones (Spec-Bench's accept length).

Two rules, one walk from the root down the draft tree (children tried in draft order):

* A draft token drawn from the drafter's distribution ``draft_probs`` (a model drafter's chain): accept it
  with probability min(1, p(x) / q(x)); on rejection the residual becomes norm(max(0, p - q)) (speculative
  sampling, Leviathan et al. 2023; Chen et al. 2023). The token emitted at this position is then distributed
  exactly as p.
* A deterministic draft token (n-gram and database drafters: a one-hot q), possibly one of several siblings:
  accept sibling x with probability p'(x) under the current residual p'; on rejection set p'(x) = 0 and
  renormalise, then try the next sibling; if all are rejected, draw from p'. This is SpecInfer's multi-step
  speculative sampling (Miao et al., 2024) with one-hot proposals, i.e. drawing from p by trying candidates
  without replacement (multi-candidate speculative decoding, Yang et al. 2024): P(emit x_1) = p(x_1);
  P(emit x_2) = (1 - p(x_1)) * p(x_2) / (1 - p(x_1)) = p(x_2); any other token y is emitted with
  probability (1 - sum p(x_i)) * p(y) / (1 - sum p(x_i)) = p(y). The emitted token is distributed as p at
  every position, so the output is distributed exactly as plain sampling from the target.

Several stochastic siblings are valid only if they were drawn independently from the same q (SpecInfer's
condition); specbench's model drafters propose chains, so each stochastic node has one child at most.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen: temperature 0 is greedy (argmax); otherwise softmax(logits / temperature)
    restricted to the smallest set of tokens whose probability reaches ``top_p`` (nucleus sampling)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_distribution(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[n, vocab] logits -> [n, vocab] float32 probabilities after temperature and top-p."""
    assert logits.ndim == 2
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep a token if the probability mass before it is still below top_p (the first one always).
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= sampling.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a [vocab] distribution."""
    return int(torch.multinomial(probs, 1, generator=generator))


def sampled_accepted_path(
    parents: np.ndarray,
    node_tokens: np.ndarray,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    candidates: np.ndarray | None,
    generator: torch.Generator,
) -> tuple[list[int], int]:
    """Walk the draft tree with the two rules of this module; return (accepted path as node indices, root
    excluded; the recovered or bonus token).

    parents, node_tokens: [n_nodes] in node numbering (node 0 = the last committed token).
    target_probs: [n_nodes, vocab] the target's distribution after each node.
    draft_probs:  [n_nodes - 1, vocab] the distribution each draft token was drawn from, or None when the
                  draft is deterministic.
    candidates:   [n_nodes] bool, False for nodes that may not be accepted; None = all may be.
    """
    children: dict[int, list[int]] = {}
    for node in range(1, parents.size):
        if candidates is None or candidates[node]:
            children.setdefault(int(parents[node]), []).append(node)
    path: list[int] = []
    node = 0
    uniforms = iter(torch.rand(parents.size, generator=generator, device=generator.device).tolist())
    while True:
        residual = target_probs[node]
        accepted = None
        for child in children.get(node, ()):
            token = int(node_tokens[child])
            if draft_probs is not None:
                proposal = draft_probs[child - 1]
                if next(uniforms) * proposal[token] < residual[token]:
                    accepted = child
                    break
                residual = torch.clamp(residual - proposal, min=0.0)
            else:
                if next(uniforms) < float(residual[token]) / float(residual.sum()):
                    accepted = child
                    break
                residual = residual.clone()
                residual[token] = 0.0
            total = residual.sum()
            # Rounding can leave no mass only where acceptance was certain; fall back to the target's.
            residual = residual / total if total > 0 else target_probs[node]
        if accepted is None:
            return path, draw(residual, generator)
        path.append(accepted)
        node = accepted
