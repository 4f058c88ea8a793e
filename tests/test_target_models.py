"""The targets researchers use today (Llama-3.1-8B-Instruct, Qwen2.5-7B-Instruct, Qwen3-8B, Vicuna-33B): their configs'
wiring, the conversation specbench hands each family's chat template, and the EOS ids a run stops at.

No hub is reachable, so the tokenizers' own template files are not here. The templates below are compact ones
written for these tests after each family's documented format; the expected prompts are written out literally,
independently of them, so that a test pins the conversation specbench passes: the system message, the earlier
answer as an assistant turn, the generation prompt and the template's keywords.
"""

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from specbench.config import check_config, compose
from specbench.decoding.loop import Decoder
from specbench.drafters.ar import NoDraft
from specbench.errors import SpecbenchError
from specbench.targets.transformers import parameter_count
from specbench.models.tiny import tiny_parameter_count
from specbench.models.prompt_format import ChatTemplate
from specbench.testing import greedy_reference

NEW_MODELS = {  # config -> (hub id, prompt format, family)
    "llama3.1-8b-instruct": ("meta-llama/Llama-3.1-8B-Instruct", "chat_template", "llama3.1"),
    "qwen2.5-7b-instruct": ("Qwen/Qwen2.5-7B-Instruct", "chat_template", "qwen2.5"),
    "qwen3-8b": ("Qwen/Qwen3-8B", "chat_template", "qwen3"),
    "vicuna-33b": ("lmsys/vicuna-33b-v1.3", "vicuna", "vicuna"),
}


# ---- the configs' wiring ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(NEW_MODELS))
def test_each_new_model_composes_and_its_family_has_a_draft_of_its_tokenizer(name):
    model = compose([f"model={name}"]).model
    assert (model.name, model.hub_id, model.prompt_format, model.family) == (name, *NEW_MODELS[name])
    check_config(compose([f"model={name}"]))
    expected_draft = {"llama3.1": "meta-llama/Llama-3.2-1B-Instruct", "qwen2.5": "Qwen/Qwen2.5-0.5B-Instruct",
                      "qwen3": "Qwen/Qwen3-0.6B", "vicuna": "double7/vicuna-68m"}[model.family]
    for drafter in ("sps", "opt-small"):
        drafts = compose([f"drafter={drafter}", f"model={name}"]).drafter.drafts_by_family
        assert drafts[model.family].hub_id == expected_draft


def test_the_eagle_heads_of_the_new_models():
    eagle = compose(["drafter=eagle"]).drafter.heads_by_model
    eagle3 = compose(["drafter=eagle3"]).drafter.heads_by_model
    assert eagle["vicuna-33b"].hub_id == "yuhuili/EAGLE-Vicuna-33B-v1.3"
    assert eagle["llama3.1-8b-instruct"].hub_id == "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"
    assert eagle3["llama3.1-8b-instruct"].hub_id == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert eagle3["qwen3-8b"].hub_id == "AngelSlim/Qwen3-8B_eagle3"
    # no EAGLE-1 head is published for the Qwen targets, nor an EAGLE-3 one by EAGLE's authors for Qwen2.5
    assert not {"qwen2.5-7b-instruct", "qwen3-8b"} & set(eagle) and "qwen2.5-7b-instruct" not in eagle3


@pytest.mark.parametrize("overrides, message", [
    (["model=vicuna-33b", "+model.chat_template_kwargs={enable_thinking:false}"],
     "model.chat_template_kwargs (enable_thinking) is read only with model.prompt_format=chat_template, not vicuna; "
     "set it to {} or null"),
    (["model=qwen3-8b", "+model.chat_template_kwargs.add_generation_prompt=false"],
     "model.chat_template_kwargs.add_generation_prompt is passed by specbench itself; a key may be any template "
     "variable but add_generation_prompt, conversation, messages, return_dict, tokenize"),
    (["model=vicuna-33b", "+model.chat_template_kwargs=[enable_thinking]"],
     "model.chat_template_kwargs must map chat-template variable names to values, e.g. {enable_thinking: false}, "
     "got ['enable_thinking']"),
    (["model=qwen2.5-7b-instruct", "model.prompt_format=chatml"],
     "model.prompt_format='chatml' is not known; choose one of chat_template, vicuna, llama2, plain"),
    (["model=tiny-random", "model.architecture=gpt2"],
     "model.architecture='gpt2' is not known; choose one of llama, qwen2, qwen3"),
], ids=["not-a-chat-template", "reserved", "not-a-mapping", "prompt-format", "architecture"])
def test_a_bad_template_keyword_or_architecture_is_refused_before_anything_loads(overrides, message):
    with pytest.raises(SpecbenchError) as error:
        check_config(compose(overrides))
    assert str(error.value) == message


# ---- the chat templates ------------------------------------------------------------------------------------------

# MT-bench question 81, both turns, and a short first answer.
Q1 = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and "
      "must-see attractions.")
Q2 = "Rewrite your previous response. Start every sentence with the letter A."
A1 = "Aloha! My trip to Hawaii began on Oahu, where I learned to hula."

# Llama-3.1-Instruct: a system header with the knowledge cut-off and a date opens every prompt (the system prompt, if
# any, after them); each turn is a header and its trimmed text, ended by <|eot_id|>.
LLAMA31_TEMPLATE = (
    "{{- bos_token }}"
    "{%- set system = '' %}{%- set turns = messages %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set turns = messages[1:] %}{%- endif %}"
    "{%- if date_string is not defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\nToday Date: '"
    " + date_string + '\\n\\n' + system + '<|eot_id|>' }}"
    "{%- for message in turns %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
# Qwen2.5-Instruct: ChatML, with Qwen's own system prompt when the conversation has none.
QWEN25_TEMPLATE = (
    "{%- set turns = messages %}"
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set turns = messages[1:] %}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in turns %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3: ChatML without a default system prompt; an earlier answer keeps only what follows its </think>; with
# enable_thinking false the generation prompt holds an empty thought.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
CONTROL_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>",
                  "<|im_end|>", "<|endoftext|>")


def chat_tokenizer(template: str, eos_token: str, bos_token: str | None = None):
    """A byte-level tokenizer (every string round-trips, so equal ids mean equal text) with the families' control
    tokens as single tokens and ``template`` as its chat template. Given a BOS, it prepends it to plain encodes, as
    Llama-3's tokenizer does: a prompt rendered by the template must not get a second one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(CONTROL_TOKENS))
    if bos_token is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", special_tokens=[(bos_token, backend.token_to_id(bos_token))])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos_token, eos_token=eos_token)
    tokenizer.chat_template = template
    return tokenizer


LLAMA31 = chat_tokenizer(LLAMA31_TEMPLATE, "<|eot_id|>", bos_token="<|begin_of_text|>")
QWEN25 = chat_tokenizer(QWEN25_TEMPLATE, "<|im_end|>")
QWEN3 = chat_tokenizer(QWEN3_TEMPLATE, "<|im_end|>")


def rendered(tokenizer, system_message=None, template_kwargs=None, first_answer=A1) -> list[int]:
    return ChatTemplate(tokenizer, system_message, template_kwargs).encode([Q1, Q2], [first_answer])


def assert_renders(tokenizer, ids: list[int], expected: str) -> None:
    assert ids == tokenizer.encode(expected, add_special_tokens=False), tokenizer.decode(ids)


def test_llama31_second_turn_opens_with_the_system_header_and_ends_at_the_assistant_header():
    ids = rendered(LLAMA31)
    assert_renders(LLAMA31, ids, (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{Q1}<|eot_id|>"
        f"<|start_header_id|>assistant<|end_header_id|>\n\n{A1}<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{Q2}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"))
    assert ids.count(LLAMA31.bos_token_id) == 1 and ids.count(LLAMA31.eos_token_id) == 4


def test_llama31_system_message_and_date_keyword():
    ids = rendered(LLAMA31, "You are a helpful assistant.", {"date_string": "01 Dec 2026"})
    assert_renders(LLAMA31, ids, (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 01 Dec 2026\n\nYou are a helpful assistant.<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{Q1}<|eot_id|>"
        f"<|start_header_id|>assistant<|end_header_id|>\n\n{A1}<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{Q2}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"))


def test_qwen25_second_turn_with_its_default_system_prompt():
    ids = rendered(QWEN25)
    assert_renders(QWEN25, ids, (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{Q1}<|im_end|>\n"
        f"<|im_start|>assistant\n{A1}<|im_end|>\n"
        f"<|im_start|>user\n{Q2}<|im_end|>\n"
        "<|im_start|>assistant\n"))
    assert ids.count(QWEN25.eos_token_id) == 4


def test_qwen25_system_message_replaces_the_default():
    assert_renders(QWEN25, rendered(QWEN25, "You are a helpful assistant."), (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{Q1}<|im_end|>\n"
        f"<|im_start|>assistant\n{A1}<|im_end|>\n"
        f"<|im_start|>user\n{Q2}<|im_end|>\n"
        "<|im_start|>assistant\n"))


QWEN3_NOT_THINKING = (
    f"<|im_start|>user\n{Q1}<|im_end|>\n"
    f"<|im_start|>assistant\n{A1}<|im_end|>\n"
    f"<|im_start|>user\n{Q2}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen3_with_the_configs_keywords_answers_without_thinking():
    kwargs = OmegaConf.to_container(compose(["model=qwen3-8b"]).model.chat_template_kwargs)
    assert_renders(QWEN3, rendered(QWEN3, template_kwargs=kwargs), QWEN3_NOT_THINKING)
    # the template's default (no keyword) thinks: the prompt stops at the assistant's header
    assert_renders(QWEN3, rendered(QWEN3), QWEN3_NOT_THINKING.removesuffix("<think>\n\n</think>\n\n"))


def test_qwen3_drops_the_thinking_of_an_earlier_answer():
    thought = f"<think>\nThe user wants a blog post.\n</think>\n\n{A1}"
    assert_renders(QWEN3, rendered(QWEN3, template_kwargs={"enable_thinking": False}, first_answer=thought),
                   QWEN3_NOT_THINKING)


def test_a_keyword_the_template_does_not_read_is_refused_naming_those_it_reads():
    with pytest.raises(SpecbenchError) as error:
        ChatTemplate(LLAMA31, None, {"enable_thinking": False, "date_strng": "x"})
    assert str(error.value) == ("model.chat_template_kwargs.date_strng, model.chat_template_kwargs.enable_thinking: "
                                "not read by the tokenizer's chat template; the variables it reads: bos_token, "
                                "date_string")
    with pytest.raises(SpecbenchError, match=r"enable_thinking: not read .* it reads: none beside the conversation$"):
        ChatTemplate(QWEN25, None, {"enable_thinking": False})


# ---- EOS ids -----------------------------------------------------------------------------------------------------

# Where each family's checkpoint names its EOS ids; a run must stop at every one. Names stand for token ids.
EOS_LAYOUTS = {
    # Llama-3.1-Instruct: generation_config.json and config.json list <|end_of_text|>, <|eom_id|>, <|eot_id|>
    # (128001, 128008, 128009); its tokenizer's eos is <|eot_id|>, which ends an assistant turn.
    "llama3.1-instruct": {"generation_config": ["end_of_text", "eom", "eot"],
                          "config": ["end_of_text", "eom", "eot"], "tokenizer": "eot"},
    # Qwen2.5-Instruct, Qwen3: generation_config.json lists <|im_end|>, <|endoftext|> (151645, 151643); config.json
    # and the tokenizer name <|im_end|> alone.
    "qwen": {"generation_config": ["im_end", "endoftext"], "config": "im_end", "tokenizer": "im_end"},
    # a tokenizer whose eos neither config names
    "tokenizer-only": {"generation_config": "end", "config": "end", "tokenizer": "turn_end"},
}


def eos_names(sources: dict) -> list[str]:
    """The EOS names a layout uses, each once, in order."""
    names = []
    for value in sources.values():
        names += [name for name in ([value] if isinstance(value, str) else value) if name not in names]
    return names


EOS_CASES = [(layout, name) for layout, sources in EOS_LAYOUTS.items() for name in eos_names(sources)]
VOCAB = 64
PROMPT = [3, 14, 15, 9, 26, 5]


@pytest.fixture(scope="module")
def free_run():
    """A 1-layer Llama, its greedy continuation of PROMPT (no EOS), a token that first appears at position >= 3 of
    it, that position, and ids the continuation never reaches."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, initializer_range=0.2, bos_token_id=1,
                         eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # the free run: no EOS
    continuation = greedy_reference(model, PROMPT, 24)
    position = next(i for i in range(3, len(continuation)) if continuation[i] not in continuation[:i])
    unused = [token for token in range(4, VOCAB) if token not in continuation]
    return model, continuation, continuation[position], position, unused


def save_checkpoint(directory, model, generation_eos, config_eos, tokenizer_eos: int):
    """``model`` with these EOS ids in its generation_config.json and config.json, and a word-level tokenizer whose
    eos_token is token ``tokenizer_eos``: a checkpoint directory as ``hf download`` writes one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model.config.eos_token_id = config_eos
    model.generation_config.eos_token_id = generation_eos
    model.save_pretrained(directory)
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0", eos_token=f"w{tokenizer_eos}").save_pretrained(
        directory)


@pytest.mark.parametrize("layout, stopping", EOS_CASES)
def test_a_run_stops_at_every_eos_id_the_checkpoint_names(layout, stopping, free_run, tmp_path):
    """The run's EOS set is the union of generation_config's (a list), config's and the tokenizer's; the
    continuation reaches ``stopping`` first, the others never, so it ends exactly there only if that one counts."""
    from specbench.models import load_pretrained

    model, continuation, stop_token, position, unused = free_run
    sources = EOS_LAYOUTS[layout]
    others = iter(unused)
    ids = {name: stop_token if name == stopping else next(others) for name in eos_names(sources)}

    def resolve(value):
        return ids[value] if isinstance(value, str) else [ids[name] for name in value]

    save_checkpoint(tmp_path, model, resolve(sources["generation_config"]), resolve(sources["config"]),
                    ids[sources["tokenizer"]])
    # PyTorch's linear kernels, as the free run had
    loaded = load_pretrained("eos-test", path=str(tmp_path), device="cpu", prompt_format="plain", linear_backend="aten")
    assert loaded.eos_token_ids == frozenset(ids.values())
    generation = Decoder(loaded.target, loaded.eos_token_ids, 8).generate(PROMPT, NoDraft(), len(continuation))
    assert generation.finish_reason == "eos"
    assert generation.token_ids == continuation[: position + 1]


# ---- the tiny stand-ins ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("architecture, model_class", [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM"),
                                                       ("qwen3", "Qwen3ForCausalLM")])
def test_tiny_random_builds_each_architecture_with_the_parameters_it_counts(architecture, model_class):
    tiny = instantiate(compose(["model=tiny-random", f"model.architecture={architecture}", "model.num_layers=1"]).model,
                       device="cpu", linear_backend="aten")
    assert type(tiny.weights.module).__name__ == model_class
    assert tiny.source == "random:seed=0:shape=64x128x1x4x2:init=0.02" + (
        "" if architecture == "llama" else f":architecture={architecture}")
    assert parameter_count(tiny.weights.module) == tiny_parameter_count(258, 64, 128, 1, 4, 2, architecture)
