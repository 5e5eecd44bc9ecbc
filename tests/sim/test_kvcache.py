from relstream.sim.kvcache import PrefixCachedKV, block_hashes


def test_hashes_chain_over_the_whole_prefix():
    a = block_hashes(list(range(40)), 16)
    b = block_hashes([*range(16), *range(100, 124)], 16)
    assert len(a) == 2  # the last 8 tokens are not a full block
    assert a[0] == b[0] and a[1] != b[1]
    # the same block after a different prefix is a different block
    assert block_hashes([*range(16, 32)], 16)[0] != a[1]


def test_published_prompt_blocks_are_hits_for_a_shared_prefix():
    kv = PrefixCachedKV(capacity_blocks=20, block_size=16)
    first = block_hashes(list(range(48)), 16)
    assert kv.allocate_batch([("r1", first, 48, 60)]) == {"r1": 0}
    kv.publish_prompt("r1", first)
    second = block_hashes([*range(32), *range(500, 530)], 16)
    assert kv.hit_blocks(second, 62) == 2
    # a fully cached prompt still recomputes its last block (it samples the first token)
    assert kv.hit_blocks(first, 48) == 2


def test_released_blocks_stay_cached_until_evicted_lru_first():
    kv = PrefixCachedKV(capacity_blocks=4, block_size=16)
    old = block_hashes(list(range(33)), 16)
    new = block_hashes(list(range(1000, 1033)), 16)
    for rid, hashes in (("old", old), ("new", new)):
        kv.allocate_batch([(rid, hashes, 33, 33)])  # 3 blocks each
        kv.publish_prompt(rid, hashes)
        kv.release(rid)
    # "new" took the plain block and evicted old's first block; old's chain is broken.
    assert kv.hit_blocks(new, 33) == 2
    assert kv.hit_blocks(old, 33) == 0
    assert kv.free_blocks() == 4


def test_batch_allocation_pins_hits_before_taking_new_blocks():
    kv = PrefixCachedKV(capacity_blocks=5, block_size=16)
    shared = block_hashes(list(range(33)), 16)
    kv.allocate_batch([("seed", shared, 33, 33)])
    kv.publish_prompt("seed", shared)
    kv.release("seed")  # 2 cached evictable blocks + 3 plain
    other = block_hashes(list(range(2000, 2033)), 16)
    cached = kv.allocate_batch([("x", other, 33, 64), ("y", shared, 33, 33)])
    # x, first in the batch, needs 4 new blocks: taking them would evict y's prefix,
    # which the plan counted on. With y's hits pinned, x waits and y keeps its hits.
    assert cached == {"x": None, "y": 32}


def test_allocation_that_does_not_fit_is_refused_and_leaves_no_trace():
    kv = PrefixCachedKV(capacity_blocks=2, block_size=16)
    hashes = block_hashes(list(range(40)), 16)
    assert kv.allocate_batch([("r", hashes, 40, 40)]) == {"r": None}
    assert kv.free_blocks() == 2
