"""The tiny random model built in memory, for tests and quick checks of every drafter: a Llama, or a Qwen2 or
Qwen3 of the same sizes (the architectures of the Qwen2.5 and Qwen3 targets)."""

from __future__ import annotations

import math

import torch

from specbench.errors import SpecbenchError
from specbench.measure.machine import available_memory_bytes
from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.loaded import LoadedModel, finish_loading
from specbench.models.placement import choose_placement, load_placed
from specbench.models.prompt_format import ByteTokenizer, CharTokenizer
from specbench.settings import MAX_SEED
from specbench.targets.choice import check_target, target_builder

# The model is built in float32 on the host first, whatever model.dtype asks for.
BUILD_BYTES_PER_PARAMETER = 4
# model.architecture -> transformers' config and model classes. Qwen2 adds biases to the query, key and value
# projections; Qwen3 drops them and normalizes each head's queries and keys (q_norm, k_norm).
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}
# The rotary base of the Qwen2.5 and Qwen3 checkpoints (their config.json's rope_theta).
QWEN_ROPE_THETA = 1_000_000.0


def build_tiny_random(
    name: str = "tiny-random",
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_context: int = 8192,
    initializer_range: float = 0.2,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    prompt_format: str = "plain",
    alphabet: str | None = None,
    linear_backend: str = "auto",
    family: str | None = "tiny-random",
    tp_plan: str | None = None,
    device_map=None,
    architecture: str = "llama",
    target=None,
) -> LoadedModel:
    """A small Llama (or, by ``architecture``, Qwen2 or Qwen3) with random weights over a byte-level vocabulary,
    built in memory (no files).

    Its text is gibberish, but its greedy choices are deterministic, so it exercises every code path of
    drafting and verification in milliseconds. A small ``initializer_range`` makes greedy output loop, which
    gives n-gram drafters something to find. ``alphabet`` (e.g. "abcdef") replaces the 256 bytes by those
    characters, for a vocabulary small enough that sampled distributions can be checked exactly.
    ``tp_plan`` / ``device_map``: loaded again through ``from_pretrained`` with that placement (tests of tensor
    parallelism and of accelerate's placement). ``architecture``: ``llama``, ``qwen2`` or ``qwen3`` (ARCHITECTURES),
    same-architecture stand-ins for targets that cannot be downloaded here; the Qwen ones take the Qwen
    checkpoints' rotary base. ``target``: the ``model.target`` node, the Target class built around the model
    (``specbench.targets.choice``; None: the transformers target).
    """
    builder = target_builder(target)
    check_tiny_random(hidden_size=hidden_size, intermediate_size=intermediate_size, num_layers=num_layers,
                      num_heads=num_heads, num_kv_heads=num_kv_heads, max_context=max_context,
                      initializer_range=initializer_range, seed=seed, alphabet=alphabet, architecture=architecture)
    import transformers

    config_class, model_class = (getattr(transformers, class_name) for class_name in ARCHITECTURES[architecture])
    tokenizer = ByteTokenizer() if alphabet is None else CharTokenizer(alphabet)
    own = {}
    if architecture != "llama":
        own["rope_parameters"] = {"rope_type": "default", "rope_theta": QWEN_ROPE_THETA}
    if architecture == "qwen3":  # Qwen3Config's own default is 128, the 8B's
        own["head_dim"] = hidden_size // num_heads
    config = config_class(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_context,
        initializer_range=initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        **own,
    )
    config._attn_implementation = "sdpa"
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = model_class(config).to(resolve_dtype(dtype, torch.device("cpu")))
    finally:
        torch.random.set_rng_state(generator_state)
    torch_device = resolve_device(device)
    placement = choose_placement(name, tp_plan, device_map, torch_device)
    model = load_placed(model, placement, model.dtype)
    # Cached drafts, answers and trained heads are keyed by the source: whatever changes the weights is in it.
    shape = f"{hidden_size}x{intermediate_size}x{num_layers}x{num_heads}x{num_kv_heads}"
    source = (f"random:seed={seed}:shape={shape}:init={initializer_range}"
              + (f":architecture={architecture}" if architecture != "llama" else "")
              + (f":alphabet={alphabet}" if alphabet else ""))
    return finish_loading(name, model, tokenizer, prompt_format, None, torch_device, source, linear_backend,
                          family, placement.kind, target=builder)


def check_tiny_random(hidden_size: int = 64, intermediate_size: int = 128, num_layers: int = 2, num_heads: int = 4,
                      num_kv_heads: int = 2, max_context: int = 8192, initializer_range: float = 0.2, seed: int = 0,
                      alphabet: str | None = None, architecture: str = "llama", target=None, **others) -> None:
    """Refuse, with one line naming the key, the value and what is valid, a ``build_tiny_random`` argument that
    transformers or the decoding would fail on later (in LlamaConfig, in the first attention, or out of memory),
    or a ``model.target`` no loader could build (``targets.choice.check_target``); builds nothing. The other
    arguments (``others``) are checked where they are used."""
    check_target(target)
    if not isinstance(architecture, str) or architecture not in ARCHITECTURES:
        raise SpecbenchError(f"model.architecture={architecture!r} is not known; choose one of "
                             f"{', '.join(ARCHITECTURES)}")
    for key, value in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size),
                       ("num_layers", num_layers), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        _require_int(key, value, minimum=1)
    _require_int("max_context", max_context, minimum=2, why=" (a prompt of at least 1 token and 1 new token)")
    if not (isinstance(initializer_range, (int, float)) and not isinstance(initializer_range, bool)
            and math.isfinite(initializer_range) and 0 < initializer_range <= 1):
        raise SpecbenchError(f"model.initializer_range must be in (0, 1] (the standard deviation of the random "
                             f"weights; transformers refuses more), got {initializer_range!r}")
    _require_int("seed", seed, minimum=0, maximum=MAX_SEED)
    if alphabet is not None and not isinstance(alphabet, str):
        raise SpecbenchError(f"model.alphabet must be null (256 byte tokens) or a string of distinct characters, "
                             f"got {alphabet!r}")
    # Before the shapes' divisibility, so that an absurd size is refused without factoring it.
    vocab_size = (ByteTokenizer() if alphabet is None else CharTokenizer(alphabet)).vocab_size
    parameters = tiny_parameter_count(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
                                      architecture)
    needed, available = parameters * BUILD_BYTES_PER_PARAMETER, available_memory_bytes()
    if available is not None and needed > available:
        raise SpecbenchError(f"model.hidden_size={hidden_size}, model.intermediate_size={intermediate_size} and "
                             f"model.num_layers={num_layers} make {parameters:,} parameters, {needed / 2**30:.1f} GiB "
                             f"in float32, more than the {available / 2**30:.1f} GiB of memory available")
    if hidden_size % num_heads:
        raise SpecbenchError(f"model.num_heads={num_heads} must divide model.hidden_size={hidden_size} (each head "
                             f"takes hidden_size / num_heads dimensions); divisors: {_divisors(hidden_size)}")
    head_dim = hidden_size // num_heads
    if head_dim % 2:  # rotary embeddings turn pairs of dimensions
        raise SpecbenchError(f"model.hidden_size={hidden_size} / model.num_heads={num_heads} = {head_dim} dimensions "
                             f"per head, which must be even for rotary position embeddings; numbers of heads that "
                             f"give an even size: {[n for n in _divisors(hidden_size) if hidden_size // n % 2 == 0]}")
    if num_heads % num_kv_heads:
        raise SpecbenchError(f"model.num_kv_heads={num_kv_heads} must divide model.num_heads={num_heads} (grouped-"
                             f"query attention shares each key/value head among num_heads / num_kv_heads heads); "
                             f"divisors: {_divisors(num_heads)}")


def tiny_parameter_count(vocab_size: int, hidden_size: int, intermediate_size: int, num_layers: int, num_heads: int,
                         num_kv_heads: int, architecture: str = "llama") -> int:
    """Parameters of the tiny model: input embeddings and an untied output layer, and per layer the query, key,
    value and output projections, the gated MLP's three matrices and two norms; then the final norm. Qwen2 adds
    the query, key and value biases, Qwen3 a query and a key norm of one head's width."""
    head_dim = hidden_size // num_heads
    kv_size = num_kv_heads * head_dim
    per_layer = 2 * hidden_size * hidden_size + 2 * hidden_size * kv_size + 3 * hidden_size * intermediate_size \
        + 2 * hidden_size
    per_layer += {"qwen2": hidden_size + 2 * kv_size, "qwen3": 2 * head_dim}.get(architecture, 0)
    return 2 * vocab_size * hidden_size + num_layers * per_layer + hidden_size


def _require_int(key: str, value, minimum: int, maximum: int | None = None, why: str = "") -> None:
    if (not isinstance(value, int) or isinstance(value, bool) or value < minimum
            or (maximum is not None and value > maximum)):
        kind = f"an integer in [{minimum}, {maximum}]" if maximum is not None else (
            "a positive integer" if minimum == 1 else f"an integer >= {minimum}")
        raise SpecbenchError(f"model.{key} must be {kind}{why}, got {value!r}")


def _divisors(number: int) -> list[int]:
    if number > 10**12:  # too slow to factor, and no shape a machine could hold (the memory check says so)
        return []
    small = [n for n in range(1, math.isqrt(number) + 1) if number % n == 0]
    return sorted({*small, *(number // n for n in small)})


build_tiny_random.check_arguments = check_tiny_random  # config.check_group_values calls it before anything loads
