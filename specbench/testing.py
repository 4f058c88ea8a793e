"""The test kit: what tests/ and scripts/gpu_check.py both build their checks from.

The tiny random model, plain greedy decoding by transformers (the independent reference for losslessness), a
throw-away cache, a drafter built from its config as the contract tests build it, and a Target wrapper that
counts what a decoding step costs a GPU (passes, fences, blocking reads, uploads).

It imports no pytest (the GPU check runs it on a bare machine, tests/ with pytest) and reads its configs with
PyYAML, not hydra, except where a drafter is composed: on a GPU machine without hydra only the drafter factory
fails. It lives in the repository, beside tests/, whose fixture corpus it copies into the throw-away cache.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch

from specbench.decoding.target import Target, TargetChoices, VerifyInputs

REPOSITORY = Path(__file__).resolve().parents[1]
TEST_CORPUS = REPOSITORY / "tests" / "fixtures" / "corpus.txt"

PROMPTS = [
    "Summarize: the cat sat on the mat. The cat sat on the mat again, and then the cat slept.",
    "Translate German to English: Der Hund spielt im Garten.",
    "Write a list of numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12",
]


def small_model_db(max_prompts: int = 8, max_new_tokens: int = 32) -> list[str]:
    """Overrides that build HD's model database from a few short answers: its configured 96 answers of 1024 tokens
    take minutes on a CPU; a few short ones still supply drafts the target accepts (the database's lookups are
    pinned on hand-built tables elsewhere)."""
    return [f"drafter.model_db_build.max_prompts={max_prompts}", f"drafter.model_db_build.max_new_tokens={max_new_tokens}"]


# HD's model database as the tests build it.
SMALL_MODEL_DB = small_model_db()


# ---- the throw-away cache --------------------------------------------------------------------------------------


def isolated_cache(prefix: str, share_models: bool, on_made: Callable[[Path], object] = lambda cache: None) -> Path:
    """A new, empty specbench cache in a temporary folder, named by $SPECBENCH_CACHE from here on (subprocesses
    inherit it), so that databases built by a check never land in, or are read from, the user's cache. The default
    statistics corpus is replaced by the tests' small text, so nothing is downloaded.

    share_models: link ``models/`` to the real cache's, so that a converted model checkpoint (the embedded model)
                  is converted once for every test session rather than once each; and ``venvs/``, so that the
                  environments built once per machine (scripts/vllm_env.sh, scripts/floor_env.sh) are found.
    on_made:      called with the folder as soon as it exists, with Ctrl-C held back, so that the caller records
                  it for removal before an interrupt can leave it behind unrecorded (the GPU check's finally
                  removes only what it recorded; the tests register an atexit removal)."""
    from specbench.storage.cache import cache_root

    real_models = cache_root(None) / "models"
    if share_models:
        real_models.mkdir(parents=True, exist_ok=True)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        cache = Path(tempfile.mkdtemp(prefix=prefix))
        on_made(cache)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    try:  # an interrupt while it is being filled removes it too
        if share_models:
            (cache / "models").symlink_to(real_models, target_is_directory=True)
            real_venvs = cache_root(None) / "venvs"
            if real_venvs.is_dir():
                (cache / "venvs").symlink_to(real_venvs, target_is_directory=True)
        corpus = cache / "corpora" / "python-docs"
        corpus.mkdir(parents=True)
        shutil.copy(TEST_CORPUS, corpus / "corpus.txt")
    except BaseException:
        shutil.rmtree(cache, ignore_errors=True)
        raise
    os.environ["SPECBENCH_CACHE"] = str(cache)
    return cache


# ---- the tiny models -------------------------------------------------------------------------------------------


def tiny_random(device: str | torch.device = "cpu", dtype: str = "float32", linear_backend: str = "auto",
                **settings):
    """tiny-random exactly as ``model=tiny-random`` builds it (conf/model/tiny-random.yaml), on ``device`` in
    ``dtype``; ``settings`` override the config's keys (architecture, tp_plan, device_map, ...). The config is read
    with PyYAML, so that checks which need no drafter config run without hydra and omegaconf."""
    import yaml

    from specbench.models.tiny import build_tiny_random

    values = yaml.safe_load((REPOSITORY / "conf" / "model" / "tiny-random.yaml").read_text())
    target = values.pop("_target_")
    if target != "specbench.models.tiny.build_tiny_random":
        raise RuntimeError(f"conf/model/tiny-random.yaml builds {target}, which the test kit does not know")
    unknown = set(settings) - set(values)
    if unknown:
        raise TypeError(f"tiny-random has no setting(s) {', '.join(sorted(unknown))}")
    values.update(dtype=dtype, **settings)
    return build_tiny_random(**values, device=str(device), linear_backend=linear_backend)


def prompt_ids(model, prompts: Iterable[str] = PROMPTS) -> list[list[int]]:
    """``prompts`` as one-turn conversations in the model's prompt format."""
    return [model.encode_conversation([text], []) for text in prompts]


def save_tiny_checkpoint(directory: Path) -> Path:
    """A 1-layer Llama and a word-level tokenizer saved as a checkpoint directory in milliseconds (what a GGUF
    conversion writes, what a local ``model.path`` holds); returns its weight file."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{word: 3 + i for i, word in enumerate("a b c d e f".split())}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory) / "model.safetensors"


# ---- the greedy reference --------------------------------------------------------------------------------------


def _generate_greedy(module: torch.nn.Module, ids: list[int], max_new_tokens: int, eos_token_ids, **extra):
    input_ids = torch.tensor([ids], device=module.device)
    with torch.no_grad():
        return module.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                               max_new_tokens=max_new_tokens, eos_token_id=list(eos_token_ids) or None,
                               pad_token_id=0, **extra)


def greedy_reference(module: torch.nn.Module, ids: list[int], max_new_tokens: int, eos_token_ids=()) -> list[int]:
    """Plain greedy decoding by transformers' generate(): the independent reference for losslessness."""
    return _generate_greedy(module, ids, max_new_tokens, eos_token_ids)[0, len(ids):].tolist()


def greedy_reference_with_top(module: torch.nn.Module, ids: list[int], max_new_tokens: int,
                              top_k: int = 8) -> tuple[list[int], tuple[np.ndarray, np.ndarray]]:
    """``greedy_reference`` and the top ``top_k`` (ids, logits) of every step's raw logits ([n, k] each, on the
    host), to classify a difference from it as a near-tie or a violation (``specbench.measure.mismatch``)."""
    output = _generate_greedy(module, ids, max_new_tokens, (), return_dict_in_generate=True, output_logits=True)
    logits = torch.stack([step[0] for step in output.logits]).float()
    top = torch.topk(logits, top_k, dim=-1)
    return output.sequences[0, len(ids):].tolist(), (top.indices.cpu().numpy(), top.values.cpu().numpy())


# ---- the drafter factory ---------------------------------------------------------------------------------------


def configured_drafter(name: str, target, model_db: list[str] = SMALL_MODEL_DB, overrides: Iterable[str] = ()):
    """The drafter of ``conf/drafter/<name>.yaml`` composed with ``model=tiny-random`` and prepared for ``target``,
    but for HD's model database, built as ``model_db`` says (few, short answers): that changes what it drafts,
    not whether the output is greedy's. Needs hydra."""
    from hydra.utils import instantiate

    from specbench.config import compose

    database = model_db if "model_db_build" in compose([f"drafter={name}"]).drafter else []
    drafter = instantiate(compose([f"drafter={name}", "model=tiny-random", *database, *overrides]).drafter)
    drafter.prepare(target)
    return drafter


# ---- the counting Target ---------------------------------------------------------------------------------------


class CountingTarget(Target):
    """Another Target, with what costs a GPU a round trip counted in ``counts``:

    passes:  forward passes (prefill and verify);
    syncs:   fences (``synchronize``);
    reads:   blocking device-to-host reads;
    uploads: host-to-device copies.

    A TransformersTarget's reads and uploads are its own transfers (every upload of a pass: ids, positions, the
    mask block, the offsets of moved cache entries), counted on a shallow copy of it, so that the target given is
    never changed and every other user of it (a session's shared tiny model) counts nothing. Any other Target's
    reads are its passes (the interface hands back the choices on the host) and its uploads are the calls of
    ``upload``. Replaces patching the target's class, which changes every instance until it is undone."""

    def __init__(self, inner: Target):
        self.counts = {"passes": 0, "syncs": 0, "reads": 0, "uploads": 0}
        self._counts_transfers = _is_transformers_target(inner)
        self.inner = _with_counted_transfers(inner, self.counts) if self._counts_transfers else inner
        self.vocab_size = inner.vocab_size
        self.num_layers = inner.num_layers
        self.device = inner.device

    def since(self, earlier: dict[str, int]) -> dict[str, int]:
        """The counts made after ``earlier`` (a copy of ``counts`` taken then)."""
        return {key: value - earlier.get(key, 0) for key, value in self.counts.items()}

    def _pass(self) -> None:
        self.counts["passes"] += 1
        if not self._counts_transfers:
            self.counts["reads"] += 1

    def start(self, capacity: int) -> None:
        self.inner.start(capacity)

    def release(self) -> None:
        self.inner.release()

    @property
    def length(self) -> int:
        return self.inner.length

    def prefill(self, prompt_ids: np.ndarray, every_position: bool, top_k: int) -> TargetChoices:
        self._pass()
        return self.inner.prefill(prompt_ids, every_position, top_k)

    def verify(self, inputs: VerifyInputs, n_nodes: int, top_k: int) -> TargetChoices:
        self._pass()
        return self.inner.verify(inputs, n_nodes, top_k)

    def skipping_pass(self, tokens: np.ndarray, skip, after: int | None = None) -> torch.Tensor:
        self._pass()
        return self.inner.skipping_pass(tokens, skip, after)

    def keep(self, start: int, nodes: list[int]) -> None:
        self.inner.keep(start, nodes)

    def truncate(self, length: int) -> None:
        self.inner.truncate(length)

    def synchronize(self) -> None:
        self.counts["syncs"] += 1
        self.inner.synchronize()

    def upload(self, array: np.ndarray, role: str = "upload") -> torch.Tensor:
        if not self._counts_transfers:
            self.counts["uploads"] += 1
        return self.inner.upload(array, role)

    def request_hidden_states(self, layers: tuple[int, ...]) -> None:
        self.inner.request_hidden_states(layers)

    def hidden_states(self, rows: list[int] | None = None) -> torch.Tensor | None:
        return self.inner.hidden_states(rows)


def _is_transformers_target(target: Target) -> bool:
    from specbench.targets.transformers import TransformersTarget

    return isinstance(target, TransformersTarget)


def _with_counted_transfers(target, counts: dict[str, int]):
    """A shallow copy of a TransformersTarget (the same model, its own sequence) whose one blocking read and
    host-to-device copies count into ``counts``. The class's methods are looked up at each call, so a test that
    replaces one (to fake a device's behaviour) is still counted."""
    import copy

    counted = copy.copy(target)
    cls = type(target)

    def download(tensor):
        counts["reads"] += 1
        return cls._download(counted, tensor)

    def upload_to(array, device, role="offsets"):
        counts["uploads"] += 1
        return cls._upload_to(counted, array, device, role)

    counted._download, counted._upload_to = download, upload_to
    return counted
