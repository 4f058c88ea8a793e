"""The tiny random model built in memory, for tests and quick checks of every drafter."""

from __future__ import annotations

import torch

from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.loaded import LoadedModel, finish_loading
from specbench.models.placement import choose_placement, load_placed
from specbench.prompts import ByteTokenizer, CharTokenizer


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
) -> LoadedModel:
    """A small Llama with random weights over a byte-level vocabulary, built in memory (no files).

    Its text is gibberish, but its greedy choices are deterministic, so it exercises every code path of
    drafting and verification in milliseconds. A small ``initializer_range`` makes greedy output loop, which
    gives n-gram drafters something to find. ``alphabet`` (e.g. "abcdef") replaces the 256 bytes by those
    characters, for a vocabulary small enough that sampled distributions can be checked exactly.
    ``tp_plan`` / ``device_map``: loaded again through ``from_pretrained`` with that placement (tests of tensor
    parallelism and of accelerate's placement).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = ByteTokenizer() if alphabet is None else CharTokenizer(alphabet)
    config = LlamaConfig(
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
    )
    config._attn_implementation = "sdpa"
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config).to(resolve_dtype(dtype, torch.device("cpu")))
    finally:
        torch.random.set_rng_state(generator_state)
    torch_device = resolve_device(device)
    placement = choose_placement(name, tp_plan, device_map, torch_device)
    model = load_placed(model, placement, model.dtype)
    source = f"random:seed={seed}" + (f":alphabet={alphabet}" if alphabet else "")
    return finish_loading(name, model, tokenizer, prompt_format, None, torch_device, source, linear_backend,
                          family, placement.kind)
