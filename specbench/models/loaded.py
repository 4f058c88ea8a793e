"""``LoadedModel``, what every loader returns, and the steps all loaders share once the weights are in."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch

from specbench.decoding.target import Target
from specbench.errors import SpecbenchError
from specbench.models.prompt_format import PromptFormat, check_prompt_arguments, make_prompt_format
from specbench.targets.choice import build_target, check_target
from specbench.targets.kernels import use_linear_backend
from specbench.targets.transformers import TransformersWeights
from specbench.targets.weights import TargetWeights


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, with what the runner needs to talk to it: ``target``, the ``Target`` the
    decoding loop runs (the class ``model.target`` names: ``specbench.targets.choice``), and ``weights``, the
    ``TargetWeights`` builders and run.json read, both constructed by the loader (``finish_loading``). The
    properties below answer from one of the two what drafters and the runner read most."""

    name: str
    target: Target
    weights: TargetWeights
    tokenizer: object
    prompt_format: PromptFormat
    eos_token_ids: frozenset[int]
    max_context: int
    source: str
    family: str | None = None
    placement: str = "single"
    # Where another engine (vLLM) can load the same weights from: a checkpoint directory or a hub id; None for a
    # model built in memory (tiny-random), which that engine saves first.
    checkpoint: str | None = None
    _fingerprint: str | None = None

    @property
    def device(self) -> torch.device:
        """Where the target's logits are (for a model spread over devices: its output layer's)."""
        return self.target.device

    @property
    def devices(self) -> tuple[torch.device, ...]:
        return self.target.devices

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.dtype

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def num_layers(self) -> int:
        return self.target.num_layers

    @property
    def parameter_count(self) -> int:
        """Parameters of the whole model (under tensor parallelism: of every shard together)."""
        return self.weights.parameter_count

    def encode_conversation(self, questions: list[str], answers: list[str]) -> list[int]:
        return self.prompt_format.encode(questions, answers)

    @property
    def tokenizer_fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = tokenizer_fingerprint(self.tokenizer)
        return self._fingerprint

    @property
    def weights_fingerprint(self) -> str:
        return self.weights.fingerprint

    def decode(self, token_ids) -> str:
        """Answer text as Spec-Bench stores it: special tokens dropped, surrounding whitespace stripped."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True).strip()


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's vocabulary (token -> id): databases of token ids are only valid for a
    target whose tokenizer has the same fingerprint."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def _eos_ids(model, tokenizer) -> frozenset[int]:
    """Every EOS id the checkpoint names, a run stopping at the first of any: its generation_config's (one id or a
    list: Llama-3.1-Instruct's lists <|end_of_text|>, <|eom_id|> and <|eot_id|>, Qwen's <|im_end|> and
    <|endoftext|>), its config's and its tokenizer's, which may differ from both."""
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else value)
    if not ids:
        raise SpecbenchError("the model defines no EOS token; set one in its generation_config")
    return frozenset(int(i) for i in ids)


def check_loader_arguments(target=None, **others) -> None:
    """The GGUF and hub loaders' ``check_arguments`` (``config.check_group_values`` runs it before anything loads):
    their ``model.target`` (``targets.choice.check_target``) and prompt format (``check_prompt_arguments``)."""
    check_target(target)
    check_prompt_arguments(**others)


def finish_loading(name, model, tokenizer, prompt_format, system_message, device, source, linear_backend,
                   family=None, placement: str = "single", chat_template_kwargs=None,
                   checkpoint: str | None = None, target=None) -> LoadedModel:
    """The last steps of every loader: move the model to ``device`` in eval mode (unless ``placement`` says
    accelerate or tensor parallelism placed it already), choose its linear kernels, and wrap it with its prompt
    format (``chat_template_kwargs``: the chat template's keywords), EOS ids and context length. ``target``: the
    ``model.target`` node, which names the Target class built around the model (``targets.choice.build_target``;
    None: the transformers target)."""
    if placement == "device_map":
        from specbench.models.placement import check_loaded_placement

        check_loaded_placement(model)  # accelerate's own choice (auto, balanced): nothing offloaded is timed
    elif placement == "tensor_parallel":
        from specbench.models.placement import report_shards

        report_shards(model)
    if placement == "single":
        model.to(device)
    elif linear_backend == "onednn":
        raise SpecbenchError(f"run.linear_backend=onednn replaces the linear layers that {placement} placement "
                             "hooks; use run.linear_backend=auto or aten")
    else:
        linear_backend = "aten"  # the engines' hooks sit on transformers' own linear layers
    model.eval()
    use_linear_backend(model, linear_backend)
    text_config = model.config.get_text_config()
    return LoadedModel(
        name=name,
        target=build_target(target, model),
        weights=TransformersWeights(model),
        tokenizer=tokenizer,
        prompt_format=make_prompt_format(prompt_format, tokenizer, system_message, chat_template_kwargs),
        eos_token_ids=_eos_ids(model, tokenizer),
        max_context=int(getattr(text_config, "max_position_embeddings", 2048)),
        source=source,
        family=family,
        placement=placement,
        checkpoint=checkpoint,
    )
