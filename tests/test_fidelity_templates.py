"""FastChat's conversation templates as Spec-Bench's evaluation renders them, restated from FastChat's source (not
from specbench's strings): a prompt that drifts by a space changes every token after it.

Spec-Bench builds each turn's prompt with ``get_conversation_template``, ``append_message(roles[0], question)``,
``append_message(roles[1], None)``, ``get_prompt()`` and tokenizes it with the BOS token (``tokenizer([prompt])``;
SB ``evaluation/eval.py:165-176`` @fd2c1cd); an earlier turn's answer is the message it had answered
(``conv.messages[-1][-1] = output``, ``eval.py:227``). ``get_conversation_template("vicuna")`` is FastChat's
``vicuna_v1.1``. The templates: lm-sys/FastChat ``fastchat/conversation.py``
@0e6d3e4.
"""

import pytest

from specbench.config import compose
from specbench.models.prompt_format import ByteTokenizer, make_prompt_format

# vicuna_v1.1 (conversation.py:771-781): this system message, roles USER / ASSISTANT, ADD_COLON_TWO with
# sep " " and sep2 "</s>"; get_prompt (:90-101) writes system + sep, then "ROLE: message" + sep / sep2 by turn
# parity, and a bare "ROLE:" for the open answer.
VICUNA_SYSTEM_MESSAGE = ("A chat between a curious user and an artificial intelligence assistant. The assistant "
                         "gives helpful, detailed, and polite answers to the user's questions.")
VICUNA_FIRST_TURN = VICUNA_SYSTEM_MESSAGE + " USER: How are you? ASSISTANT:"
VICUNA_SECOND_TURN = VICUNA_SYSTEM_MESSAGE + " USER: How are you? ASSISTANT: Fine, thanks.</s>USER: And now? ASSISTANT:"

# llama-2 (conversation.py:1738-1747), FastChat's template for Llama-2-chat models (Spec-Bench's eval.py asks for
# "vicuna" whatever the model, so this one is what FastChat, not Spec-Bench, renders for them): roles [INST] / [/INST], LLAMA2 with sep " " and sep2 " </s><s>"; with no
# system message get_prompt (:148-163) starts "[INST] ", writes the first question + " ", every later message as
# tag + " " + message + sep / sep2 by parity, and the bare tag for the open answer.
LLAMA2_FIRST_TURN = "[INST] How are you? [/INST]"
LLAMA2_SECOND_TURN = "[INST] How are you? [/INST] Fine, thanks. </s><s>[INST] And now? [/INST]"


def rendered(prompt_format: str, questions, answers) -> tuple[bool, str]:
    tokenizer = ByteTokenizer()
    ids = make_prompt_format(prompt_format, tokenizer).encode(questions, answers)
    return ids[0] == tokenizer.bos_token_id, tokenizer.decode(ids[1:])


@pytest.mark.parametrize("model,first,second", [
    ("vicuna-7b", VICUNA_FIRST_TURN, VICUNA_SECOND_TURN),
    ("vicuna-13b", VICUNA_FIRST_TURN, VICUNA_SECOND_TURN),
    ("vicuna-33b", VICUNA_FIRST_TURN, VICUNA_SECOND_TURN),
    ("llama2-7b-chat", LLAMA2_FIRST_TURN, LLAMA2_SECOND_TURN),
    ("llama2-13b-chat", LLAMA2_FIRST_TURN, LLAMA2_SECOND_TURN),
], ids=lambda value: value if value.count(" ") == 0 else "")
def test_a_models_prompt_is_fastchats_template_as_spec_bench_renders_it(model, first, second):
    prompt_format = compose([f"model={model}"]).model.prompt_format
    assert rendered(prompt_format, ["How are you?"], []) == (True, first)
    assert rendered(prompt_format, ["How are you?", "And now?"], ["Fine, thanks."]) == (True, second)
