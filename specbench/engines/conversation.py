"""A question decoded turn by turn, the one turn loop every engine answers through (``converse``): a later turn's
prompt holds the earlier turns and the engine's own answers to them, every turn gets the run's answer length cut
to what the context leaves, and its seed is the turn's own. An engine hands in how it decodes one turn
(``DecodeTurn``); the specbench loop's is ``answer_question``'s, vLLM's is a request to its engine."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specbench.decoding.contract import Drafter
from specbench.decoding.loop import Decoder
from specbench.errors import SpecbenchError
from specbench.models.prompt_format import too_long_for_context
from specbench.questions import Prompt
from specbench.results.schema import Answer, StepRecord

if TYPE_CHECKING:
    from specbench.models import LoadedModel


class TurnTooLong(SpecbenchError):
    pass


@dataclass
class DecodedTurn:
    """One turn as an engine decoded it: its tokens (up to and including the EOS token that ended it), its steps,
    its wall time and the top logits per token ([n, k] ids and values) the mismatch diagnosis reads."""

    token_ids: list[int]
    steps: list[StepRecord]
    wall_s: float
    top: tuple[np.ndarray, np.ndarray]


# How an engine decodes one turn: (turn index, prompt ids, tokens it may add, the turn's seed) -> the turn.
DecodeTurn = Callable[[int, list[int], int, int], DecodedTurn]


def turn_seed(seed: int, question_id, turn: int) -> int:
    """The random seed of one turn: the same for the method and its baseline, independent of question order."""
    return zlib.crc32(f"{seed}:{question_id}:{turn}".encode())


def converse(model: LoadedModel, prompt: Prompt, max_new_tokens: int, max_context: int, seed: int,
             decode: DecodeTurn) -> Answer:
    """Every turn of ``prompt`` decoded by ``decode``: turn t's prompt is the first t + 1 user turns with the
    answers to the earlier ones, in the model's prompt format; it may add ``max_new_tokens`` tokens, fewer when
    ``max_context`` (the context the engine gives a request) leaves less. ``TurnTooLong`` when a turn's prompt
    leaves no room for a token: the question cannot be answered whole."""
    answer = Answer()
    for turn in range(len(prompt.turns)):
        prompt_ids = model.encode_conversation(list(prompt.turns[: turn + 1]), answer.texts)
        budget = max_context - len(prompt_ids)
        if budget < 1:
            raise TurnTooLong(too_long_for_context(prompt.question_id, turn + 1, len(prompt_ids), model.name,
                                                   max_context))
        decoded = decode(turn, prompt_ids, min(max_new_tokens, budget), turn_seed(seed, prompt.question_id, turn))
        answer.texts.append(model.decode(decoded.token_ids))
        answer.token_ids.append(decoded.token_ids)
        answer.steps.append(decoded.steps)
        answer.wall_times.append(decoded.wall_s)
        answer.top.append(decoded.top)
    return answer


def answer_question(
    model: LoadedModel, decoder: Decoder, drafter: Drafter, prompt: Prompt, max_new_tokens: int, on_step=None
) -> Answer:
    """Decode every turn of ``prompt`` with the specbench loop (``converse``)."""
    # What the draft budget learned belongs to one question, so that a question measures the same whatever ran
    # before it, and a resumed run the same as an uninterrupted one.
    decoder.forget_learning()

    def decode(turn: int, prompt_ids: list[int], budget: int, seed: int) -> DecodedTurn:
        generation = decoder.generate(prompt_ids, drafter, budget, on_step=on_step, seed=seed)
        return DecodedTurn(generation.token_ids, generation.steps, generation.wall_s,
                           (generation.top_ids, generation.top_logits))

    return converse(model, prompt, max_new_tokens, model.max_context, decoder.sampling.seed, decode)


def first_turn_tokens(model: LoadedModel, prompt: Prompt) -> int:
    """How many tokens ``prompt``'s first turn is in ``model``'s prompt format (``Engine.prompt_tokens``)."""
    return len(model.encode_conversation([prompt.turns[0]], []))


def first_turn_ids(model: LoadedModel, prompt: Prompt, max_context: int | None = None) -> list[int]:
    """The token ids of ``prompt``'s first turn; ``TurnTooLong`` when they leave no room for an answer in
    ``max_context`` (the model's context when None)."""
    context = model.max_context if max_context is None else max_context
    prompt_ids = model.encode_conversation([prompt.turns[0]], [])
    if len(prompt_ids) >= context:  # the answer needs room for at least one token
        raise TurnTooLong(too_long_for_context(prompt.question_id, 1, len(prompt_ids), model.name, context))
    return prompt_ids
