"""Shared fixtures: the tiny random model and greedy references computed with transformers' generate()."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from specbench.storage.cache import cache_root
from specbench.config import compose
from specbench.decoding.contract import Draft, Drafter


def _isolated_cache() -> Path:
    """Databases built by tests go to a throw-away cache (inherited by subprocesses through the environment);
    converted model checkpoints are shared with the real cache, so the embedded model is converted once.
    The default statistics corpus is replaced by a small text written for the tests."""
    real = cache_root(None)
    (real / "models").mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="specbench-test-cache-"))
    (cache / "models").symlink_to(real / "models", target_is_directory=True)
    corpus = cache / "corpora" / "python-docs"
    corpus.mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "fixtures" / "corpus.txt", corpus / "corpus.txt")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    os.environ["SPECBENCH_CACHE"] = str(cache)
    return cache


TEST_CACHE = _isolated_cache()

# HD's model database as the tests build it: its configured 96 answers of 1024 tokens take minutes on a CPU; these
# few short answers still supply drafts the target accepts (the database's lookups are pinned on hand-built tables).
SMALL_MODEL_DB = ["drafter.model_db_build.max_prompts=8", "drafter.model_db_build.max_new_tokens=32"]

PROMPTS = [
    "Summarize: the cat sat on the mat. The cat sat on the mat again, and then the cat slept.",
    "Translate German to English: Der Hund spielt im Garten.",
    "Write a list of numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12",
]


@pytest.fixture(scope="session")
def tiny():
    """tiny-random exactly as ``model=tiny-random`` builds it."""
    return instantiate(compose(["model=tiny-random"]).model, device="cpu", linear_backend="auto")


# Every Target implementation, by name: the lossless contract tests run over each (``each_target``).
TARGET_KINDS = ("transformers", "reference")


def target_of(kind: str, loaded):
    """A fresh Target of ``kind`` over ``loaded``'s transformers module (the reference one has no KV cache)."""
    from specbench.targets.reference import ReferenceTarget
    from specbench.targets.transformers import TransformersTarget

    return {"transformers": TransformersTarget, "reference": ReferenceTarget}[kind](loaded.weights.module)


@pytest.fixture(scope="session", params=TARGET_KINDS)
def each_target(request, tiny):
    """tiny-random behind each Target implementation in turn."""
    return target_of(request.param, tiny)


@pytest.fixture(scope="session")
def prompt_ids(tiny):
    return [tiny.encode_conversation([text], []) for text in PROMPTS]


def refusal(call, *args, **kwargs) -> str:
    """The one-line SpecbenchError that ``call(*args, **kwargs)`` raises (a test fails on a second line)."""
    from specbench.errors import SpecbenchError

    with pytest.raises(SpecbenchError) as error:
        call(*args, **kwargs)
    message = str(error.value)
    assert "\n" not in message, message
    return message


def greedy_reference(model, prompt_ids, max_new_tokens, eos_token_ids=()):
    """Plain greedy decoding by transformers, the independent reference for losslessness."""
    eos = list(eos_token_ids) or None
    input_ids = torch.tensor([prompt_ids])
    output = model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=max_new_tokens,
        eos_token_id=eos, pad_token_id=0,
    )
    return output[0, len(prompt_ids):].tolist()


class ScriptedDrafter(Drafter):
    """Test drafter that drafts from a known continuation of the prompt.

    mode "right": the next ``length`` tokens of ``continuation`` (always accepted);
    mode "wrong": those tokens shifted by one (never accepted);
    ``empty_every``: propose nothing on every n-th step.
    """

    def __init__(self, continuation, length, mode="right", empty_every=0, vocab_size=258):
        self.name = f"scripted-{mode}"
        self.continuation = list(continuation)
        self.length = length
        self.mode = mode
        self.empty_every = empty_every
        self.vocab_size = vocab_size
        self.prompt_length = 0
        self.calls = 0

    def begin(self, prompt_ids):
        self.prompt_length = prompt_ids.size
        self.calls = 0

    def propose(self, context_ids):
        self.calls += 1
        if self.empty_every and self.calls % self.empty_every == 0:
            return Draft.empty()
        done = context_ids.size - self.prompt_length
        tokens = np.array(self.continuation[done: done + self.length], dtype=np.int64)
        if self.mode == "wrong":
            tokens = (tokens + 1) % self.vocab_size
        return Draft.chain(tokens)
