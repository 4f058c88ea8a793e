import torch

from specbench.targets.kv_cache import TreeKVCache


def fill(cache, values):
    """Write one step of len(values) positions into layer 0 and 1; entry value = the given number."""
    states = torch.tensor(values, dtype=torch.float32).view(1, 1, -1, 1).expand(1, 2, -1, 3).contiguous()
    for layer in range(2):
        cache.update(states, states * 10, layer)


def layer_values(cache, layer=0):
    return cache.layers[layer].keys[0, 0, :, 0].tolist()


def test_appends_grow_past_the_initial_capacity():
    cache = TreeKVCache(num_layers=2, initial_capacity=2)
    fill(cache, [1, 2, 3])
    fill(cache, [4])
    assert cache.length == 4 and cache.get_seq_length() == 4
    assert layer_values(cache) == [1, 2, 3, 4]
    assert cache.layers[1].values[0, 0, :, 0].tolist() == [10, 20, 30, 40]


def test_keep_nodes_of_a_chain_only_truncates():
    cache = TreeKVCache(2, 16)
    fill(cache, [1, 2])
    fill(cache, [3, 4, 5, 6])
    cache.keep_nodes(2, [0, 1])
    assert layer_values(cache) == [1, 2, 3, 4]


def test_keep_nodes_of_a_tree_moves_the_accepted_path_together():
    cache = TreeKVCache(2, 16)
    fill(cache, [1, 2])
    fill(cache, [30, 31, 32, 33, 34])  # nodes 0..4 written at positions 2..6
    cache.keep_nodes(2, [0, 3, 4])
    assert layer_values(cache, 0) == [1, 2, 30, 33, 34]
    assert layer_values(cache, 1) == [1, 2, 30, 33, 34]
    fill(cache, [7])
    assert layer_values(cache) == [1, 2, 30, 33, 34, 7]


def test_truncate_forgets_the_tail():
    cache = TreeKVCache(2, 4)
    fill(cache, [1, 2, 3])
    cache.truncate(1)
    fill(cache, [9])
    assert layer_values(cache) == [1, 9]


def test_both_crop_conventions_and_both_mask_size_arguments_of_transformers_5():
    cache = TreeKVCache(2, 16)
    fill(cache, [1, 2, 3, 4, 5, 6])
    layer = cache.layers[0]
    layer.crop(-2)  # every 5.x release: a count to remove
    assert layer_values(cache) == [1, 2, 3, 4]
    layer.crop(3)  # before 5.15: the length to keep
    assert layer_values(cache) == [1, 2, 3]
    layer.crop(0)
    assert layer_values(cache) == [1, 2, 3]
    # 5.4 on pass the query's length, 5.0 to 5.3 its cache positions
    assert layer.get_mask_sizes(4) == layer.get_mask_sizes(torch.arange(3, 7)) == (7, 0)
