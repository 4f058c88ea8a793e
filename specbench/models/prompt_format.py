"""Turning a (multi-turn) question into the prompt token ids a model was trained to see.

A conversation is the user turns so far and the model's answers to all but the last of them; the prompt
ends where the model's next answer begins. For MT-bench's second turn the prompt therefore holds the first
question, the model's own first answer and the second question, as in Spec-Bench.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from specbench.errors import SpecbenchError

VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)


class PromptFormat(ABC):
    """Renders a conversation to token ids with one tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @abstractmethod
    def encode(self, questions: list[str], answers: list[str]) -> list[int]:
        """Token ids for ``questions`` (user turns) and ``answers`` (one fewer: the model's earlier answers)."""


# What ChatTemplate.encode hands apply_chat_template itself (the conversation, as the template's ``messages``, and
# the three keywords below): a chat_template_kwargs entry of one of these names would collide with it.
RESERVED_TEMPLATE_KEYWORDS = ("add_generation_prompt", "conversation", "messages", "return_dict", "tokenize")


class ChatTemplate(PromptFormat):
    """The tokenizer's own chat template (Hugging Face ``apply_chat_template``).

    ``template_kwargs`` are variables for the template beside the conversation (Qwen3's ``enable_thinking``,
    Llama-3.1's ``date_string``); each must be a variable the template reads, where its text can be read
    (``chat_template_variables``), since a keyword the template never reads is silently ignored.
    """

    def __init__(self, tokenizer, system_message: str | None = None, template_kwargs: Mapping | None = None):
        super().__init__(tokenizer)
        if not getattr(tokenizer, "chat_template", None):
            raise SpecbenchError("prompt_format=chat_template, but the tokenizer has no chat template")
        self.system_message = system_message
        self.template_kwargs = check_chat_template_kwargs("chat_template", template_kwargs)
        variables = chat_template_variables(tokenizer) if self.template_kwargs else None
        unread = sorted(set(self.template_kwargs) - variables) if variables is not None else []
        if unread:
            readable = sorted(variables - set(RESERVED_TEMPLATE_KEYWORDS) - set(_JINJA_GLOBALS))
            raise SpecbenchError(f"{', '.join(f'model.chat_template_kwargs.{key}' for key in unread)}: not read by "
                                 f"the tokenizer's chat template; the variables it reads: "
                                 f"{', '.join(readable) or 'none beside the conversation'}")

    def encode(self, questions, answers):
        messages = [{"role": "system", "content": self.system_message}] if self.system_message else []
        for index, question in enumerate(questions):
            messages.append({"role": "user", "content": question})
            if index < len(answers):
                messages.append({"role": "assistant", "content": answers[index]})
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True, **self.template_kwargs)
        return list(encoded["input_ids"])


# Names a template reads that its environment defines, Jinja's (range, dict, namespace, ...) and transformers'
# (raise_exception, strftime_now): no keyword of the template's own.
_JINJA_GLOBALS = ("cycler", "dict", "joiner", "lipsum", "namespace", "range", "raise_exception", "strftime_now")


def chat_template_variables(tokenizer) -> frozenset[str] | None:
    """The variables a tokenizer's chat template reads from outside (Jinja's undeclared names: ``messages``,
    ``add_generation_prompt``, ``bos_token``, ``enable_thinking``, ...), or None where that cannot be told: several
    named templates without a default, or a template plain Jinja cannot parse (transformers' own
    ``{% generation %}`` tag)."""
    import jinja2
    from jinja2 import meta

    try:
        template = tokenizer.get_chat_template()
    except ValueError:  # several named templates and none called "default": apply_chat_template refuses it too
        return None
    try:
        return frozenset(meta.find_undeclared_variables(jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
                                                        .parse(template)))
    except jinja2.TemplateError:  # e.g. a syntax error on a tag plain Jinja does not know
        return None


def check_chat_template_kwargs(prompt_format: str, chat_template_kwargs) -> dict:
    """``model.chat_template_kwargs`` as a plain dict, refused in one line for what is wrong before anything
    loads: not a mapping of variable names, set for a prompt format that has no template, or naming what
    specbench passes itself (RESERVED_TEMPLATE_KEYWORDS). Whether the template reads each: ``ChatTemplate``."""
    if chat_template_kwargs is None:
        return {}
    chat_template_kwargs = _plain(chat_template_kwargs)
    if not isinstance(chat_template_kwargs, Mapping) or not all(
            isinstance(key, str) and key.isidentifier() for key in chat_template_kwargs):
        raise SpecbenchError(f"model.chat_template_kwargs must map chat-template variable names to values, e.g. "
                             f"{{enable_thinking: false}}, got {chat_template_kwargs!r}")
    if chat_template_kwargs and prompt_format != "chat_template":
        raise SpecbenchError(f"model.chat_template_kwargs ({', '.join(chat_template_kwargs)}) is read only with "
                             f"model.prompt_format=chat_template, not {prompt_format}; set it to {{}} or null")
    reserved = sorted(set(chat_template_kwargs) & set(RESERVED_TEMPLATE_KEYWORDS))
    if reserved:
        raise SpecbenchError(f"model.chat_template_kwargs.{reserved[0]} is passed by specbench itself; a key may be "
                             f"any template variable but {', '.join(RESERVED_TEMPLATE_KEYWORDS)}")
    return dict(chat_template_kwargs)


def _plain(value):
    """An OmegaConf node (Hydra passes nested config so) as plain dicts and lists; anything else as it is."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # scripts/gpu_check.py runs without omegaconf
        return value
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


class Vicuna(PromptFormat):
    """FastChat's ``vicuna_v1.1`` conversation template, which Spec-Bench uses for Vicuna models:
    ``SYSTEM USER: q1 ASSISTANT: a1</s>USER: q2 ASSISTANT:``, tokenized with the BOS token."""

    def encode(self, questions, answers):
        text = VICUNA_SYSTEM + " "
        for index, question in enumerate(questions):
            text += f"USER: {question} "
            text += f"ASSISTANT: {answers[index]}</s>" if index < len(answers) else "ASSISTANT:"
        return list(self.tokenizer.encode(text))


class Llama2Chat(PromptFormat):
    """FastChat's ``llama-2`` template (no system message, as in Spec-Bench):
    ``[INST] q1 [/INST] a1 </s><s>[INST] q2 [/INST]``, tokenized with the BOS token."""

    def encode(self, questions, answers):
        text = ""
        for index, question in enumerate(questions):
            text += f"[INST] {question} [/INST]"
            if index < len(answers):
                text += f" {answers[index]} </s><s>"
        return list(self.tokenizer.encode(text))


class Plain(PromptFormat):
    """``USER: q1\\nASSISTANT: a1\\nUSER: q2\\nASSISTANT:`` for models without a chat format (tests)."""

    def encode(self, questions, answers):
        text = ""
        for index, question in enumerate(questions):
            text += f"USER: {question}\nASSISTANT:"
            if index < len(answers):
                text += f" {answers[index]}\n"
        return list(self.tokenizer.encode(text))


PROMPT_FORMATS = {"chat_template": ChatTemplate, "vicuna": Vicuna, "llama2": Llama2Chat, "plain": Plain}


def make_prompt_format(name: str, tokenizer, system_message: str | None = None,
                       chat_template_kwargs: Mapping | None = None) -> PromptFormat:
    check_prompt_arguments(name, chat_template_kwargs)
    if name == "chat_template":
        return ChatTemplate(tokenizer, system_message, chat_template_kwargs)
    return PROMPT_FORMATS[name](tokenizer)


def check_prompt_arguments(prompt_format: str = "chat_template", chat_template_kwargs=None, **others) -> None:
    """Refuse, in one line, a ``model.prompt_format`` that is not known or ``model.chat_template_kwargs`` it cannot
    take; the loaders' ``check_arguments`` (config.check_group_values runs it before anything loads). The other
    arguments (``others``) are checked where they are used."""
    if prompt_format not in PROMPT_FORMATS:
        raise SpecbenchError(f"model.prompt_format={prompt_format!r} is not known; choose one of "
                             f"{', '.join(PROMPT_FORMATS)}")
    check_chat_template_kwargs(prompt_format, chat_template_kwargs)


def too_long_for_context(question_id, turn: int, prompt_tokens: int, model_name: str, max_context: int) -> str:
    """Why turn ``turn`` (counted from 1) of a question cannot be answered: its prompt of ``prompt_tokens``
    leaves no room in the context for the answer's first token (``prompt_tokens >= max_context``)."""
    earlier = " (the earlier turns and answers included)" if turn > 1 else ""
    if prompt_tokens > max_context:
        size = f"{prompt_tokens} tokens{earlier}, more than {model_name}'s context of {max_context}"
    else:
        size = f"{prompt_tokens} tokens{earlier}, as many as {model_name}'s context of {max_context} holds"
    return (f"question {question_id} turn {turn}: the prompt has {size}, leaving no room for an answer; a prompt "
            f"may have at most {max_context - 1} tokens ({prompt_tokens - max_context + 1} fewer), so that at least "
            f"1 token can be generated")


class ByteTokenizer:
    """UTF-8 bytes as token ids 0-255, then BOS and EOS: a tokenizer that needs no files, for tiny models."""

    def __init__(self):
        self.bos_token_id = 256
        self.eos_token_id = 257
        self.vocab_size = 258

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        data = bytes(int(i) for i in ids if int(i) < 256)
        return data.decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        return {**{f"<0x{i:02X}>": i for i in range(256)}, "<s>": self.bos_token_id, "</s>": self.eos_token_id}


class CharTokenizer:
    """A tokenizer over a fixed alphabet: character i is token i, then BOS and EOS; other characters are
    dropped. For tiny test models whose vocabulary must be small."""

    def __init__(self, alphabet: str):
        if not alphabet or len(set(alphabet)) != len(alphabet):
            raise SpecbenchError(f"model.alphabet must be distinct characters, got {alphabet!r}")
        self.alphabet = alphabet
        self.index = {char: i for i, char in enumerate(alphabet)}
        self.bos_token_id = len(alphabet)
        self.eos_token_id = len(alphabet) + 1
        self.vocab_size = len(alphabet) + 2

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [self.index[char] for char in text if char in self.index]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.alphabet[int(i)] for i in ids if int(i) < len(self.alphabet))

    def get_vocab(self) -> dict[str, int]:
        return {**self.index, "<s>": self.bos_token_id, "</s>": self.eos_token_id}
