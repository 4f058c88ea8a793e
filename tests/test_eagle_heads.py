"""EAGLE heads: the forward pinned against a plain-torch reference, the KV cache, the three checkpoint formats and
the loader's checks that a head fits its target."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from specbench.errors import SpecbenchError
from specbench.heads import eagle_head_files
from specbench.heads.eagle_head_files import load_eagle_head, save_eagle_head
from specbench.heads.eagle_heads import HeadConfig, build_head, draft_offsets, head_config_for, rotary_inverse_frequencies
from specbench.models.tiny import build_tiny_random

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
LAYER_WEIGHTS = {f"self_attn.{name}.weight" for name in ATTENTION} | {f"mlp.{name}.weight" for name in MLP}
DRAFT_VOCAB = 100


@pytest.fixture(scope="module")
def target():
    """A 6-layer tiny target, enough for EAGLE-3's default layers (2, 3, 3)."""
    return build_tiny_random(num_layers=6)


@pytest.fixture(scope="module")
def other_target():
    """The same shapes as ``target`` and other weights: another model that a head must not be taken for."""
    return build_tiny_random(num_layers=6, seed=1)


def make_head(target, kind, seed=0, draft_vocab_size=None, **overrides):
    """A head for ``target`` with every weight random (norms near 1, not 1: a misplaced norm must show)."""
    config = head_config_for(target, kind, draft_vocab_size=draft_vocab_size, **overrides)
    torch.manual_seed(seed)
    head = build_head(config, target.weights.module.get_output_embeddings(),
                      target.weights.module.get_input_embeddings().weight)
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if name == "embed_tokens.weight":
                continue
            noise = torch.randn_like(parameter)
            if name.endswith("norm.weight"):
                parameter.copy_(1 + 0.3 * noise)
            else:  # activations of order 1, so that float32 rounding stays near 1e-6
                parameter.copy_(noise / math.sqrt(parameter.shape[-1]))
    if config.draft_vocab_size < config.vocab_size:
        head.set_draft_vocabulary(torch.randperm(config.vocab_size)[:config.draft_vocab_size].sort().values)
    return head.eval()


def inputs(head, n=6, seed=1, from_target=True):
    generator = torch.Generator().manual_seed(seed)
    width = head.config.fc_in_features if head.config.kind == "eagle3" else head.config.target_hidden_size
    width = width if from_target else head.config.hidden_size
    token_ids = torch.randint(0, head.config.vocab_size, (n,), generator=generator)
    return token_ids, torch.randn(n, width, generator=generator)


def run(head, token_ids, hidden, start=0, from_target=True):
    """Outputs and draft logits of ``head`` over a fresh cache, positions from ``start``."""
    with torch.no_grad():
        out = head(token_ids, hidden, torch.arange(len(token_ids)) + start, head.new_cache(4), None, from_target)
        return out, head.draft_logits(out)



def lm_head_weight(target):
    """The target's output matrix, also when run.linear_backend packed it for oneDNN."""
    lm_head = target.weights.module.get_output_embeddings()
    weight = getattr(lm_head, "weight", None)
    return (weight if weight is not None else lm_head.packed_weight.to_dense()).detach()


def ref_rms(x, weight, eps):
    return weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def ref_attention(x, weights, prefix, config, positions):
    """Causal softmax attention written out: rotary positions by rotate-half, kv head j // groups for head j."""
    n, heads, kv_heads, dim = x.shape[0], config.num_attention_heads, config.num_key_value_heads, config.head_dim
    q = (x @ weights[prefix + "q_proj.weight"].T).view(n, heads, dim)
    k = (x @ weights[prefix + "k_proj.weight"].T).view(n, kv_heads, dim)
    v = (x @ weights[prefix + "v_proj.weight"].T).view(n, kv_heads, dim)
    inverse = torch.tensor([config.rope_theta ** (-(2 * i) / dim) for i in range(dim // 2)])
    angles = positions.float()[:, None] * inverse[None, :]
    cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None]  # [n, 1, dim]: the same angle for every head
    sin = torch.cat((angles.sin(), angles.sin()), -1)[:, None]

    def rotate(t):
        return t * cos + torch.cat((-t[..., dim // 2:], t[..., :dim // 2]), -1) * sin

    q, k = rotate(q), rotate(k)
    heads_out = []
    for head in range(heads):
        kv = head // (heads // kv_heads)
        scores = q[:, head] @ k[:, kv].T / math.sqrt(dim)
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        weights_of_keys = (scores - scores.max(-1, keepdim=True).values).exp()
        probs = weights_of_keys / weights_of_keys.sum(-1, keepdim=True)
        heads_out.append(probs @ v[:, kv])
    return torch.cat(heads_out, -1) @ weights[prefix + "o_proj.weight"].T


def ref_mlp(x, weights, prefix):
    gate = x @ weights[prefix + "gate_proj.weight"].T
    up = x @ weights[prefix + "up_proj.weight"].T
    return (gate * torch.sigmoid(gate) * up) @ weights[prefix + "down_proj.weight"].T


def reference(head, target, token_ids, hidden, positions, from_target=True, variant=None):
    """(out, draft logits) of EAGLE's heads as the notes describe them; ``variant`` = one plausible mistake."""
    weights = {key: value.detach() for key, value in head.state_dict().items()}
    config, eps = head.config, head.config.rms_norm_eps
    embeddings = weights["embed_tokens.weight"][token_ids]
    if config.kind == "eagle":
        pair = (hidden, embeddings) if variant == "feature first" else (embeddings, hidden)
        x = torch.cat(pair, -1) @ weights["fc.weight"].T + weights["fc.bias"]
        attention_input = ref_rms(x, 1.0, eps) if variant == "input norm" else x
        h = x + ref_attention(attention_input, weights, "layers.0.self_attn.", config, positions)
        post = ref_rms(h, weights["layers.0.post_attention_layernorm.weight"], eps)
        out = h + ref_mlp(post, weights, "layers.0.mlp.")
        return out, out @ lm_head_weight(target).T
    fused = hidden @ weights["fc.weight"].T if from_target else hidden
    normed_embeddings = ref_rms(embeddings, weights["layers.0.input_layernorm.weight"], eps)
    normed_hidden = ref_rms(fused, weights["layers.0.hidden_norm.weight"], eps)
    pair = (normed_hidden, normed_embeddings) if variant == "hidden first" else (normed_embeddings, normed_hidden)
    residual = normed_hidden if variant == "normed residual" else fused
    h = residual + ref_attention(torch.cat(pair, -1), weights, "layers.0.self_attn.", config, positions)
    out = h + ref_mlp(ref_rms(h, weights["layers.0.post_attention_layernorm.weight"], eps), weights, "layers.0.mlp.")
    final = out if variant == "no final norm" else ref_rms(out, weights["norm.weight"], eps)
    return out, final @ weights["lm_head.weight"].T


@pytest.mark.parametrize("kind, variants", [("eagle", ("feature first", "input norm")),
                                            ("eagle3", ("hidden first", "normed residual", "no final norm"))])
def test_forward_matches_the_reference_and_not_its_mistakes(target, kind, variants):
    head = make_head(target, kind, rope_theta=500.0)  # not the target's 10000: the head's own base must be used
    token_ids, hidden = inputs(head, n=7)
    positions = torch.arange(7) + 3
    out, logits = run(head, token_ids, hidden, start=3)
    expected_out, expected_logits = reference(head, target, token_ids, hidden, positions)
    torch.testing.assert_close(out, expected_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(logits, expected_logits, atol=2e-5, rtol=1e-5)
    for variant in variants:  # each mistake changes the numbers: the match above is not a coincidence
        wrong_out, wrong_logits = reference(head, target, token_ids, hidden, positions, variant=variant)
        assert (wrong_out - out).abs().max() > 1e-2 or (wrong_logits - logits).abs().max() > 1e-2, variant
    wrong_theta = HeadConfig(**{**head.config.__dict__, "rope_theta": 10000.0})
    assert not torch.allclose(rotary_inverse_frequencies(wrong_theta), rotary_inverse_frequencies(head.config))


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_own_outputs_are_fed_back_as_eagle_does(target, kind):
    """Tree expansion feeds the head's own h-wide output: through fc with the embedding (EAGLE-1), without fc
    (EAGLE-3)."""
    head = make_head(target, kind)
    token_ids, own = inputs(head, n=4, from_target=False)
    out, logits = run(head, token_ids, own, from_target=False)
    expected_out, expected_logits = reference(head, target, token_ids, own, torch.arange(4), from_target=False)
    torch.testing.assert_close(out, expected_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(logits, expected_logits, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_close_to_float32(target, dtype):
    head = make_head(target, "eagle3")
    token_ids, hidden = inputs(head)
    out32, _ = run(head, token_ids, hidden)
    half = make_head(target, "eagle3").to(dtype)
    out, logits = run(half, token_ids, hidden.to(dtype))
    assert out.dtype == dtype and logits.dtype == dtype
    assert ((out.float() - out32).norm() / out32.norm()) < 0.05


def test_llama3_rope_scaling_slows_only_long_wavelengths(target):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    plain = head_config_for(target, "eagle3", format="speculators")
    scaled = HeadConfig(**{**plain.__dict__, "rope_scaling": scaling})
    base, llama3 = rotary_inverse_frequencies(plain), rotary_inverse_frequencies(scaled)
    wavelength = 2 * math.pi / base
    short, long = wavelength < 64 / 4, wavelength > 64
    assert short.any() and long.any()
    assert torch.equal(llama3[short], base[short])
    torch.testing.assert_close(llama3[long], base[long] / 8)
    with pytest.raises(SpecbenchError, match="not supported in format eagle3"):
        HeadConfig(**{**plain.__dict__, "format": "eagle3", "rope_scaling": scaling})



@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_pieces_equal_one_pass_and_truncate_refeeds(target, kind):
    head = make_head(target, kind)
    token_ids, hidden = inputs(head, n=9)
    whole, _ = run(head, token_ids, hidden)
    cache = head.new_cache(2)  # grows twice on the way
    with torch.no_grad():
        pieces = [head(token_ids[a:b], hidden[a:b], torch.arange(a, b), cache, None, True)
                  for a, b in ((0, 4), (4, 5), (5, 9))]
        assert cache.length == 9 and cache.capacity >= 9
        torch.testing.assert_close(torch.cat(pieces), whole, atol=1e-5, rtol=1e-5)
        cache.truncate(5)
        again = head(token_ids[5:], hidden[5:], torch.arange(5, 9), cache, None, True)
    torch.testing.assert_close(again, whole[5:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        cache.truncate(10)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_tree_mask_gives_each_node_its_ancestor_path(target, kind):
    head = make_head(target, kind)
    prefix_ids, prefix_hidden = inputs(head, n=4, seed=2)
    node_ids, node_hidden = inputs(head, n=5, seed=3, from_target=False)
    parents = [-1, -1, 0, 0, 2]  # two roots; node 4 is a grandchild of node 0

    def path(node):
        return path(parents[node]) + [node] if node >= 0 else []

    depths = torch.tensor([len(path(node)) for node in range(5)])
    visible = torch.zeros(5, 4 + 5, dtype=torch.bool)
    visible[:, :4] = True
    for node in range(5):
        visible[node, [4 + ancestor for ancestor in path(node)]] = True
    with torch.no_grad():
        cache = head.new_cache(16)
        head(prefix_ids, prefix_hidden, torch.arange(4), cache, None, True)
        tree = head(node_ids, node_hidden, 3 + depths, cache, visible, False)
        for node in range(5):
            cache.truncate(4)
            chain = path(node)
            alone = head(node_ids[chain], node_hidden[chain], 3 + depths[chain], cache, None, False)
            torch.testing.assert_close(tree[node], alone[-1], atol=1e-5, rtol=1e-5)



def test_reduced_vocabulary_maps_by_offset(target):
    assert draft_offsets(torch.tensor([3, 5, 9]), 3, 10).tolist() == [3, 4, 7]
    head = make_head(target, "eagle3", draft_vocab_size=DRAFT_VOCAB)
    chosen = torch.arange(0, 2 * DRAFT_VOCAB, 2) + 7  # every other id from 7
    head.set_draft_vocabulary(chosen)
    assert torch.equal(head.d2t, chosen - torch.arange(DRAFT_VOCAB))
    assert torch.equal(head.to_target_ids(torch.tensor([0, 1, 99])), torch.tensor([7, 9, 205]))
    _, logits = run(head, *inputs(head))
    assert logits.shape[1] == DRAFT_VOCAB
    full = make_head(target, "eagle3")
    ids = torch.tensor([0, 17, 257])
    assert torch.equal(full.to_target_ids(ids), ids) and not hasattr(full, "d2t")



def file_keys(directory, format):
    if format == "eagle":
        return torch.load(directory / "pytorch_model.bin", weights_only=True)
    return load_file(str(directory / "model.safetensors"))


EXPECTED_KEYS = {
    "eagle": {"embed_tokens.weight", "fc.weight", "fc.bias", "layers.0.post_attention_layernorm.weight"}
    | {f"layers.0.{name}" for name in LAYER_WEIGHTS},
    "eagle3": {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    | {f"midlayer.{name}" for name in LAYER_WEIGHTS}
    | {f"midlayer.{norm}.weight" for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm")},
}
EXPECTED_KEYS["speculators"] = {key.replace("midlayer.", "layers.0.") for key in EXPECTED_KEYS["eagle3"]}


@pytest.mark.parametrize("format", ["eagle", "eagle3", "speculators"])
def test_save_and_load_round_trip(target, tmp_path, format):
    kind = "eagle" if format == "eagle" else "eagle3"
    vocab = None if kind == "eagle" else DRAFT_VOCAB
    layers = (1, 3, 5) if format == "speculators" else None
    head = make_head(target, kind, draft_vocab_size=vocab, feature_layers=layers, format=format)
    save_eagle_head(head, tmp_path, format)
    state = file_keys(tmp_path, format)
    assert set(state) == EXPECTED_KEYS[format]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["config.json", "pytorch_model.bin" if format == "eagle" else "model.safetensors"])
    config = json.loads((tmp_path / "config.json").read_text())
    if format == "eagle":
        assert config["num_hidden_layers"] == 1 and config["bias"] is True and config["vocab_size"] == 258
    elif format == "eagle3":
        assert config["draft_vocab_size"] == DRAFT_VOCAB and config["rope_theta"] == 10000.0
        assert "target_hidden_size" not in config  # EAGLE-3's loader would then expect embed_tokens in the file
    else:
        assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3DraftModel"]
        assert config["speculators_config"]["verifier"]["name_or_path"] == target.source
        assert config["transformer_layer_config"]["vocab_size"] == 258
        assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    if kind == "eagle3":
        assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
        assert torch.equal(state["t2d"].nonzero().flatten(), torch.arange(DRAFT_VOCAB) + state["d2t"])

    loaded = load_eagle_head(target, str(tmp_path), kind)
    assert loaded.config.format == format and not loaded.training
    assert not any(parameter.requires_grad for parameter in loaded.parameters())
    if format == "speculators":
        assert loaded.config.feature_layers == (1, 3, 5) and loaded.config.verifier == target.source
    if kind == "eagle3":  # the embedding the file lacks is the target's own tensor, not a second copy
        assert loaded.embed_tokens.weight.data_ptr() == target.weights.module.get_input_embeddings().weight.data_ptr()
    token_ids, hidden = inputs(head)
    for mine, theirs in zip(run(head, token_ids, hidden), run(loaded, token_ids, hidden)):
        torch.testing.assert_close(theirs, mine, atol=0, rtol=0)
    draft = torch.arange(10)
    assert torch.equal(loaded.to_target_ids(draft), head.to_target_ids(draft))


def test_resaving_replaces_the_other_weight_file(target, tmp_path):
    save_eagle_head(make_head(target, "eagle"), tmp_path, "eagle")
    save_eagle_head(make_head(target, "eagle3"), tmp_path, "eagle3")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


def test_loads_a_head_in_the_targets_half_precision(tmp_path):
    half = build_tiny_random(num_layers=6, dtype="bfloat16")
    save_eagle_head(make_head(half, "eagle"), tmp_path, "eagle")  # a float32 file of a bfloat16 target's embedding
    loaded = load_eagle_head(half, str(tmp_path), "eagle")
    assert loaded.fc.weight.dtype == torch.bfloat16
    token_ids, hidden = inputs(loaded)
    assert run(loaded, token_ids, hidden.bfloat16())[1].dtype == torch.bfloat16


def test_ignored_extras_load(target, tmp_path):
    save_eagle_head(make_head(target, "eagle3", format="speculators"), tmp_path, "speculators")
    state = load_file(str(tmp_path / "model.safetensors"))
    state["verifier_lm_head.weight"] = torch.zeros(3, 2)
    state["verifier_norm.weight"] = torch.zeros(2)
    state["layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)
    save_file(state, str(tmp_path / "model.safetensors"))
    load_eagle_head(target, str(tmp_path), "eagle3")


def test_warns_when_the_verifier_is_another_model(target, tmp_path, caplog):
    head = make_head(target, "eagle3", format="speculators", verifier="meta-llama/Llama-3.1-8B-Instruct")
    save_eagle_head(head, tmp_path, "speculators")
    with caplog.at_level(logging.WARNING, logger=eagle_head_files.__name__):
        load_eagle_head(target, str(tmp_path), "eagle3")
    assert "Llama-3.1-8B-Instruct" in caplog.text



def refusal(call, *fragments):
    with pytest.raises(SpecbenchError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def edit_weights(directory, change):
    state = load_file(str(directory / "model.safetensors"))
    change(state)
    save_file(state, str(directory / "model.safetensors"))


def saved(target, directory, kind="eagle3", format=None, **overrides):
    format = format or kind
    save_eagle_head(make_head(target, kind, format=format, **overrides), directory, format)
    return str(directory)


def test_missing_and_unexpected_keys(target, tmp_path):
    source = saved(target, tmp_path)
    edit_weights(tmp_path, lambda state: state.pop("midlayer.hidden_norm.weight"))
    refusal(lambda: load_eagle_head(target, source, "eagle3"), source, "missing midlayer.hidden_norm.weight")
    source = saved(target, tmp_path)
    edit_weights(tmp_path, lambda state: state.update({"midlayer.extra.weight": torch.zeros(2)}))
    refusal(lambda: load_eagle_head(target, source, "eagle3"), "unexpected midlayer.extra.weight")


def test_eagle_head_needs_its_embedding_copy(target, tmp_path):
    source = saved(target, tmp_path, "eagle")
    state = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    del state["embed_tokens.weight"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    refusal(lambda: load_eagle_head(target, source, "eagle"), "missing embed_tokens.weight")


def test_wrong_vocabulary(target, tmp_path):
    small = build_tiny_random(num_layers=6, alphabet="abcdef")
    source = saved(target, tmp_path)
    refusal(lambda: load_eagle_head(small, source, "eagle3"), source, "258", str(small.vocab_size), small.name)


def test_wrong_target_hidden_size(target, tmp_path):
    narrow = build_tiny_random(num_layers=6, hidden_size=32)
    source = saved(target, tmp_path)
    refusal(lambda: load_eagle_head(narrow, source, "eagle3"), source, "64", "32")


def test_wrong_kind_names_the_drafter(target, tmp_path):
    eagle = saved(target, tmp_path / "eagle", "eagle")
    refusal(lambda: load_eagle_head(target, eagle, "eagle3"), "drafter=eagle or drafter=eagle2")
    eagle3 = saved(target, tmp_path / "eagle3")
    refusal(lambda: load_eagle_head(target, eagle3, "eagle"), "drafter=eagle3")
    refusal(lambda: load_eagle_head(target, eagle3, "medusa"), "'medusa'", "eagle, eagle3")


def test_feature_layers_out_of_range_or_of_the_wrong_count(target, tmp_path):
    source = saved(target, tmp_path, format="speculators", feature_layers=(1, 3, 5))
    refusal(lambda: load_eagle_head(target, source, "eagle3", feature_layers=[1, 3, 9]), "[9]", "0..6")
    refusal(lambda: load_eagle_head(target, source, "eagle3", feature_layers=[1, 3]),
            "fc in-features 192", "2 feature layers", "128")


def test_default_layers_need_six_target_layers(tiny, tmp_path):
    source = saved(tiny, tmp_path)
    refusal(lambda: load_eagle_head(tiny, source, "eagle3"), "drafter.feature_layers=[...]", "has 2")
    assert load_eagle_head(tiny, source, "eagle3", feature_layers=[0, 1, 2]).config.feature_layers == (0, 1, 2)


def test_eagle_head_of_another_model(target, other_target, tmp_path):
    source = saved(target, tmp_path, "eagle")
    refusal(lambda: load_eagle_head(other_target, source, "eagle"), source, "trained for another target",
            f"{other_target.name}'s")


def test_d2t_outside_the_target_vocabulary(target, tmp_path):
    source = saved(target, tmp_path, draft_vocab_size=DRAFT_VOCAB)
    edit_weights(tmp_path, lambda state: state["d2t"].__setitem__(DRAFT_VOCAB - 1, 300))
    refusal(lambda: load_eagle_head(target, source, "eagle3"), "0..257", str(DRAFT_VOCAB - 1 + 300))


def test_hub_id_offline_and_not_cached(target, monkeypatch):
    from specbench import hub_cache

    monkeypatch.setattr(hub_cache, "cached_snapshot", lambda hub_id, revision: None)
    monkeypatch.setattr(hub_cache, "hub_reachable", lambda *args, **kwargs: False)
    refusal(lambda: load_eagle_head(target, "someone/EAGLE3-missing", "eagle3"), "not in the local Hugging Face cache",
            "`hf download someone/EAGLE3-missing`", "drafter.head.path=")


def test_directory_without_weights_or_config(target, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    refusal(lambda: load_eagle_head(target, str(tmp_path), "eagle3"), "no weights", "model.safetensors")
    (tmp_path / "config.json").unlink()
    refusal(lambda: load_eagle_head(target, str(tmp_path), "eagle3"), "no config.json")
    refusal(lambda: load_eagle_head(target, str(tmp_path / "absent"), "eagle3"), "not a directory")


def test_damaged_weights(target, tmp_path):
    source = saved(target, tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    refusal(lambda: load_eagle_head(target, source, "eagle3"), "damaged")



def test_resolve_feature_layers(target):
    eagle = make_head(target, "eagle")
    assert eagle.resolve_feature_layers(32) == (32,)
    refusal(lambda: make_head(target, "eagle", feature_layers=(7,)).resolve_feature_layers(6), "[7]", "0..6")
    eagle3 = make_head(target, "eagle3")
    assert eagle3.resolve_feature_layers(30) == (2, 15, 27)
    assert eagle3.resolve_feature_layers(32) == (2, 16, 29)
    assert eagle3.resolve_feature_layers(40) == (2, 20, 37)
    explicit = make_head(target, "eagle3", feature_layers=(4, 8, 12))
    assert explicit.resolve_feature_layers(32) == (4, 8, 12)
    refusal(lambda: eagle3.resolve_feature_layers(5), "drafter.feature_layers=[...]")
