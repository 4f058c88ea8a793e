"""A question decoded by the specbench loop, turn by turn: a later turn's prompt holds the earlier turns and the
decoder's own answers to them."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from specbench.decoding.contract import Drafter
from specbench.decoding.loop import Decoder
from specbench.errors import SpecbenchError
from specbench.models.prompt_format import too_long_for_context
from specbench.questions import Prompt
from specbench.results.schema import Answer

if TYPE_CHECKING:
    from specbench.models import LoadedModel


class TurnTooLong(SpecbenchError):
    pass


def turn_seed(seed: int, question_id, turn: int) -> int:
    """The random seed of one turn: the same for the method and its baseline, independent of question order."""
    return zlib.crc32(f"{seed}:{question_id}:{turn}".encode())


def answer_question(
    model: LoadedModel, decoder: Decoder, drafter: Drafter, prompt: Prompt, max_new_tokens: int, on_step=None
) -> Answer:
    """Decode every turn of ``prompt``; a later turn's prompt holds the earlier turns and this decoder's own
    answers to them."""
    answer = Answer()
    # What the draft budget learned belongs to one question, so that a question measures the same whatever ran
    # before it, and a resumed run the same as an uninterrupted one.
    decoder.forget_learning()
    for turn in range(len(prompt.turns)):
        prompt_ids = model.encode_conversation(list(prompt.turns[: turn + 1]), answer.texts)
        budget = model.max_context - len(prompt_ids)
        if budget < 1:
            raise TurnTooLong(too_long_for_context(prompt.question_id, turn + 1, len(prompt_ids), model.name,
                                                   model.max_context))
        generation = decoder.generate(prompt_ids, drafter, min(max_new_tokens, budget), on_step=on_step,
                                      seed=turn_seed(decoder.sampling.seed, prompt.question_id, turn))
        answer.texts.append(model.decode(generation.token_ids))
        answer.token_ids.append(generation.token_ids)
        answer.steps.append(generation.steps)
        answer.wall_times.append(generation.wall_s)
        answer.top.append((generation.top_ids, generation.top_logits))
    return answer


def first_turn_ids(model: LoadedModel, prompt: Prompt) -> list[int]:
    """The token ids of ``prompt``'s first turn; ``TurnTooLong`` when they leave no room for an answer."""
    prompt_ids = model.encode_conversation([prompt.turns[0]], [])
    if len(prompt_ids) >= model.max_context:  # the answer needs room for at least one token
        raise TurnTooLong(too_long_for_context(prompt.question_id, 1, len(prompt_ids), model.name, model.max_context))
    return prompt_ids
