"""Hydra++ heads: a checkpoint laid out as Hydra's own code saves it loads; the forward equals a plain re-statement
of Hydra's arithmetic (zankner/Hydra hydra/model/hydra_heads/prefix_mlp_head.py @3f39fbd); the fit checks refuse in
one line; what specbench writes reads back."""

import json
import math

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import refusal

from specbench.heads.hydra_heads import (
    build_head,
    head_config_for,
    load_hydra_head,
    save_hydra_head,
)
from specbench.models.tiny import build_tiny_random
from specbench.training.heads import dense_weight

HEADS, LAYERS = 4, 4


@pytest.fixture(scope="module")
def target():
    return build_tiny_random()


@pytest.fixture(scope="module")
def other_target():
    """The same shapes as ``target``, other weights: another model a head must not be taken for."""
    return build_tiny_random(seed=1)


def hydra_state(target, seed=0, heads=HEADS, layers=LAYERS):
    """A state dict named and shaped as Hydra's ``HydraPrefixMLP.state_dict()`` for ``target``, written out here
    key by key (not from specbench's module), every weight random, the shared blocks' copies equal."""
    generator = torch.Generator().manual_seed(seed)
    text = target.weights.architecture
    h, inter, vocab = text["hidden_size"], text["intermediate_size"], target.vocab_size
    n_heads = text["num_attention_heads"]
    kv = text.get("num_key_value_heads") or n_heads
    head_dim = h // n_heads

    def random(*shape, scale=None):
        return torch.randn(*shape, generator=generator) / math.sqrt(scale or shape[-1])

    prefix = "prefix_embeding_layer."
    state = {
        prefix + "embed_tokens.weight": random(vocab, h),
        prefix + "layers.0.self_attn.q_proj.weight": random(n_heads * head_dim, h),
        prefix + "layers.0.self_attn.k_proj.weight": random(kv * head_dim, h),
        prefix + "layers.0.self_attn.v_proj.weight": random(kv * head_dim, h),
        prefix + "layers.0.self_attn.o_proj.weight": random(h, n_heads * head_dim),
        prefix + "layers.0.self_attn.rotary_emb.inv_freq": torch.ones(head_dim // 2),
        prefix + "layers.0.mlp.gate_proj.weight": random(inter, h),
        prefix + "layers.0.mlp.up_proj.weight": random(inter, h),
        prefix + "layers.0.mlp.down_proj.weight": random(h, inter),
        prefix + "layers.0.input_layernorm.weight": 1 + 0.3 * random(h, scale=1),
        prefix + "layers.0.post_attention_layernorm.weight": 1 + 0.3 * random(h, scale=1),
        prefix + "norm.weight": 1 + 0.3 * random(h, scale=1),
        "input_embed_fn.weight": target.weights.input_embeddings().detach().clone(),
    }
    for i in range(heads):
        width = (i + 2) * h
        state[f"hydra_mlp.{i}.1.linear.weight"] = random(h, width)
        state[f"hydra_mlp.{i}.1.linear.bias"] = random(h, scale=1) * 0.1
        state[f"hydra_mlp.{i}.1.res_connection.weight"] = random(h, width)
        state[f"hydra_mlp.{i}.1.res_connection.bias"] = random(h, scale=1) * 0.1
        shared_weight, shared_bias = random(h, h), random(h, scale=1) * 0.1
        for block in range(1, layers):  # [Dropout, ResBlock] * (layers - 1): one module at 3, 5, 7
            state[f"hydra_mlp.{i}.{2 * block + 1}.linear.weight"] = shared_weight
            state[f"hydra_mlp.{i}.{2 * block + 1}.linear.bias"] = shared_bias
        state[f"hydra_lm_head.{i}.1.weight"] = random(vocab, h)
        state[f"hydra_lm_head.{i}.1.bias"] = random(vocab, scale=1) * 0.1
    return state


# The 13B head's config.json as published (huggingface.co/ankner/hydra-vicuna-13b-v1.3, config.json).
PUBLISHED_CONFIG = {"base_model_name_or_path": "lmsys/vicuna-13b-v1.3", "grounded_heads": True,
                    "hidden_state_offset": 0, "hydra_head_arch": "prefix-mlp", "hydra_num_heads": 4,
                    "hydra_num_layers": 4, "transformers_version": "4.33.2"}


def write_hydra_dir(directory, state, config=None):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or PUBLISHED_CONFIG))
    torch.save(state, directory / "hydra_lm_head.pt")
    return directory


# ---- an independent re-statement of Hydra's arithmetic -------------------------------------------------------


def rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def reference_prefix(state, target, states):
    """The prefix LlamaModel over ``states`` [n, h] from position 0: one decoder layer, causal, rotary base 10000,
    then the final norm (Spec-Bench model/hydra/modeling_llama_kv.py)."""
    text = target.weights.architecture
    p = "prefix_embeding_layer.layers.0."
    eps = text.get("rms_norm_eps", 1e-6)
    n, h = states.shape
    n_heads = text["num_attention_heads"]
    kv = text.get("num_key_value_heads") or n_heads
    d = h // n_heads
    x = rms(states, state[p + "input_layernorm.weight"], eps)
    q = (x @ state[p + "self_attn.q_proj.weight"].T).view(n, n_heads, d)
    k = (x @ state[p + "self_attn.k_proj.weight"].T).view(n, kv, d)
    v = (x @ state[p + "self_attn.v_proj.weight"].T).view(n, kv, d)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    angles = torch.arange(n).float()[:, None] * inv[None]
    cos, sin = torch.cat((angles, angles), -1).cos()[:, None], torch.cat((angles, angles), -1).sin()[:, None]

    def turn(t):
        return t * cos + torch.cat((-t[..., d // 2:], t[..., :d // 2]), -1) * sin

    q, k = turn(q), turn(k)
    out = torch.zeros(n, n_heads, d)
    for head in range(n_heads):
        group = head // (n_heads // kv)
        scores = q[:, head] @ k[:, group].T / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        out[:, head] = scores.softmax(-1) @ v[:, group]
    hidden = states + out.reshape(n, h) @ state[p + "self_attn.o_proj.weight"].T
    y = rms(hidden, state[p + "post_attention_layernorm.weight"], eps)
    mlp = (F.silu(y @ state[p + "mlp.gate_proj.weight"].T) * (y @ state[p + "mlp.up_proj.weight"].T)) \
        @ state[p + "mlp.down_proj.weight"].T
    return rms(hidden + mlp, state["prefix_embeding_layer.norm.weight"], eps)


def reference_head(state, index, inputs, layers=LAYERS):
    """Head ``index``: the projecting block, then the one shared block applied layers - 1 times, then its biased
    lm head."""
    def block(x, name, projecting):
        residual = x @ state[f"{name}.res_connection.weight"].T + state[f"{name}.res_connection.bias"] \
            if projecting else x
        return residual + F.silu(x @ state[f"{name}.linear.weight"].T + state[f"{name}.linear.bias"])

    x = block(inputs, f"hydra_mlp.{index}.1", True)
    for _ in range(layers - 1):
        x = block(x, f"hydra_mlp.{index}.3", False)
    return x @ state[f"hydra_lm_head.{index}.1.weight"].T + state[f"hydra_lm_head.{index}.1.bias"]


def test_a_head_in_hydras_layout_loads_and_runs_hydras_arithmetic(target, tmp_path):
    state = hydra_state(target)
    head = load_hydra_head(target, str(write_hydra_dir(tmp_path / "head", state)))
    config = head.config
    assert (config.num_heads, config.num_layers, config.hidden_state_offset, config.rope_theta) == (4, 4, 0, 10000.0)
    assert head.feature_layer(target.num_layers) == target.num_layers  # the post-norm last state
    assert not any(parameter.requires_grad for parameter in head.parameters())
    # the repeated block is one module, as Hydra's list multiplication makes it
    assert head.hydra_mlp[2][3] is head.hydra_mlp[2][5] is head.hydra_mlp[2][7]

    generator = torch.Generator().manual_seed(3)
    h = config.hidden_size
    states = torch.randn(6, h, generator=generator)
    expected_prefix = reference_prefix(state, target, states)
    cache = head.new_cache(2)
    got = torch.cat((head.prefix_states(states[:4], torch.arange(4), cache),  # in pieces, through the cache
                     head.prefix_states(states[4:], torch.arange(4, 6), cache)))
    torch.testing.assert_close(got, expected_prefix, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(head.prefix_sequences(states[None])[0], expected_prefix, atol=1e-5, rtol=1e-4)
    embeddings = target.weights.input_embeddings().detach()[torch.tensor([5, 9, 17, 30])]
    for index in range(HEADS):
        inputs = torch.cat((expected_prefix[-1], *embeddings[:index + 1]))[None]
        torch.testing.assert_close(head.head_logits(index, inputs), reference_head(state, index, inputs),
                                   atol=1e-5, rtol=1e-4)


def test_the_prefix_rotary_base_is_hydras_not_the_targets(target):
    """Hydra's prefix attention builds its rotary embedding without the base config's rope_theta: 10000 always."""
    text = {**target.weights.architecture, "rope_theta": 500000.0}
    other = SimpleNamespace(weights=SimpleNamespace(architecture=text), vocab_size=target.vocab_size, source="x")
    assert head_config_for(other, HEADS, LAYERS).rope_theta == 10000.0


def test_save_and_load_round_trip(target, tmp_path):
    head = build_head(target, head_config_for(target, HEADS, LAYERS), seed=0)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)) * 0.1)
    save_hydra_head(head, tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["config.json", "hydra_lm_head.pt"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == {"base_model_name_or_path": str(target.source), "grounded_heads": True,
                      "hidden_state_offset": 0, "hydra_head_arch": "prefix-mlp", "hydra_num_heads": 4,
                      "hydra_num_layers": 4}
    written = torch.load(tmp_path / "hydra_lm_head.pt", weights_only=True)
    assert set(written) == set(hydra_state(target)) - {"input_embed_fn.weight", "prefix_embeding_layer.embed_tokens.weight",
                                                       "prefix_embeding_layer.layers.0.self_attn.rotary_emb.inv_freq"}
    loaded = load_hydra_head(target, str(tmp_path))
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_initialised_as_hydra_does(target):
    head = build_head(target, head_config_for(target, HEADS, LAYERS), seed=0)
    lm_head = dense_weight(target.weights.output_layer())
    for index in range(HEADS):
        blocks = [head.hydra_mlp[index][position] for position in (1, 3)]
        assert all(torch.count_nonzero(block.linear.weight) == 0 for block in blocks)  # identity start
        assert torch.count_nonzero(blocks[0].res_connection.weight) > 0
        assert torch.equal(head.hydra_lm_head[index][1].weight, lm_head)
        assert torch.count_nonzero(head.hydra_lm_head[index][1].bias) > 0
    q_proj = head.prefix.layers[0].self_attn.q_proj.weight
    std = target.weights.architecture.get("initializer_range") or 0.02
    assert abs(float(q_proj.detach().std()) - std) < 0.2 * std
    assert torch.equal(head.prefix.norm.weight, torch.ones_like(head.prefix.norm.weight))
    again = build_head(target, head_config_for(target, HEADS, LAYERS), seed=0)
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))


def mutated(state, drop=(), add=None, replace=None):
    state = {key: value for key, value in state.items() if key not in drop}
    state.update(add or {})
    state.update(replace or {})
    return state


@pytest.mark.parametrize("change, message", [
    ({"hydra_head_arch": "mlp"}, "hydra_head_arch='mlp' (a Hydra architecture); supported: prefix-mlp"),
    ({"hydra_head_arch": "cross-attn"}, "supported: prefix-mlp"),
    ({"grounded_heads": False}, "grounded_heads=False; supported: true"),
    ({"hydra_num_heads": 0}, "hydra_num_heads=0; it must be an integer >= 1"),
    ({"hydra_num_layers": "4"}, "hydra_num_layers='4'"),
    ({"hidden_state_offset": 9}, "reaches below the embeddings"),
])
def test_config_refusals(target, tmp_path, change, message):
    directory = write_hydra_dir(tmp_path, hydra_state(target), {**PUBLISHED_CONFIG, **change})
    assert message in refusal(load_hydra_head, target, str(directory))


def test_weight_refusals(target, other_target, tmp_path):
    state = hydra_state(target)
    h = target.weights.hidden_size

    def refused(new_state, config=None, name="head"):
        return refusal(load_hydra_head, target, str(write_hydra_dir(tmp_path / name, new_state, config)))

    assert "missing hydra_lm_head.3.1.bias" in refused(mutated(state, drop=["hydra_lm_head.3.1.bias"]), name="a")
    assert "unexpected hydra_mlp.4.1.linear.weight" in refused(
        mutated(state, add={"hydra_mlp.4.1.linear.weight": torch.zeros(h, 6 * h)}), name="b")
    # a file of 3 layers read as 4: the fourth block is missing
    assert "does not match its config.json (4 heads of 4 layers): missing" in refused(
        hydra_state(target, layers=3), name="c")
    assert "vocabulary of 300 tokens, target tiny-random has 258" in refused(
        mutated(state, replace={"hydra_lm_head.0.1.bias": torch.zeros(300)}), name="d")
    q_name = "prefix_embeding_layer.layers.0.self_attn.q_proj.weight"
    assert f"target states of width {2 * h}, target tiny-random has hidden size {h}" in refused(
        mutated(state, replace={q_name: torch.zeros(h, 2 * h)}), name="e")
    assert "weights of the wrong shape: hydra_mlp.1.1.linear.weight" in refused(
        mutated(state, replace={"hydra_mlp.1.1.linear.weight": torch.zeros(h, 2 * h)}), name="f")
    assert "hydra_mlp.0.5.linear.weight differs from hydra_mlp.0.3.linear.weight" in refused(
        mutated(state, replace={"hydra_mlp.0.5.linear.weight": torch.zeros(h, h)}), name="g")
    assert "trained for another target" in refused(
        mutated(state, replace={"input_embed_fn.weight": other_target.weights.input_embeddings().detach()}), name="h")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(PUBLISHED_CONFIG))
    assert "Hydra head" in refusal(load_hydra_head, target, str(tmp_path / "empty"))
    assert "has no weights" in refusal(load_hydra_head, target, str(tmp_path / "empty"))
    assert refusal(load_hydra_head, target, str(tmp_path / "missing")).startswith("Hydra head ")
