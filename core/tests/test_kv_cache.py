"""The paged KV cache (slots, allocator, null block, layouts) and the PagedAttention swap point."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trnmodels.core import ops
from trnmodels.core.attention import AttentionMetadata, PagedAttention, bind_kv_caches, collect_kv_spec
from trnmodels.core.errors import ConfigError
from trnmodels.core.kv_cache import (
    NULL_BLOCK,
    BlockAllocator,
    KVSpec,
    LayerSpec,
    allocate_kv_cache,
    null_slots,
    read_sequence_kv,
    slot_mapping,
    write_kv,
)

BLOCK = 4
TABLE = torch.tensor([3, 1, 7])


def test_slot_mapping_hand_values():
    slots = slot_mapping(TABLE, torch.arange(12), BLOCK)
    assert slots.tolist() == [12, 13, 14, 15, 4, 5, 6, 7, 28, 29, 30, 31]
    assert slot_mapping(TABLE, torch.tensor([9, 0, 5]), BLOCK).tolist() == [29, 12, 5]


def test_allocator_never_returns_null_block_and_errors_when_exhausted():
    alloc = BlockAllocator(5)
    assert alloc.num_free == 4
    got = alloc.allocate(3) + alloc.allocate(1)
    assert sorted(got) == [1, 2, 3, 4] and NULL_BLOCK not in got
    assert alloc.num_free == 0
    with pytest.raises(ConfigError, match=r"1 blocks requested, 0 free of 5"):
        alloc.allocate(1)


def test_allocator_error_counts_and_minimum_size():
    alloc = BlockAllocator(4)
    alloc.allocate(2)
    with pytest.raises(ConfigError, match=r"2 blocks requested, 1 free of 4"):
        alloc.allocate(2)
    assert alloc.num_free == 1  # a failed allocation takes nothing
    with pytest.raises(ConfigError, match=r"at least 2.*got 1"):
        BlockAllocator(1)


def test_allocator_free_and_reuse():
    alloc = BlockAllocator(4)
    a = alloc.allocate(2)
    b = alloc.allocate(1)
    assert len(set(a + b)) == 3
    alloc.free(a)
    assert alloc.num_free == 2
    again = alloc.allocate(2)
    assert sorted(again) == sorted(a)
    assert alloc.allocate(0) == []


def _cache(num_blocks: int = 8, heads: int = 2, dim: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.zeros(num_blocks, heads, BLOCK, dim), torch.zeros(num_blocks, heads, BLOCK, dim))


def test_write_then_read_sequence_round_trip():
    torch.manual_seed(0)
    k_cache, v_cache = _cache()
    k, v = torch.randn(10, 2, 3), torch.randn(10, 2, 3)
    write_kv(k_cache, v_cache, k, v, slot_mapping(TABLE, torch.arange(10), BLOCK))
    torch.testing.assert_close(read_sequence_kv(k_cache, TABLE, 10), k.transpose(0, 1))
    torch.testing.assert_close(read_sequence_kv(v_cache, TABLE, 10), v.transpose(0, 1))
    # Position 5 is block 1 (table[1]), offset 1.
    torch.testing.assert_close(k_cache[1, :, 1], k[5])
    # Blocks outside the table (and the null block) are untouched.
    for block in (0, 2, 4, 5, 6):
        assert torch.all(k_cache[block] == 0) and torch.all(v_cache[block] == 0)


def test_eager_write_matches_the_indexed_assignment_of_graphs():
    """Eagerly on the CPU, contiguous caches take the flat ``index_copy_`` (rows looked up by the slots'
    values); a capture, or a cache that is a strided view, takes the indexed assignment. Both write the
    same values at the same places, from strided K/V views as a fused QKV projection yields."""
    torch.manual_seed(1)
    qkv = torch.randn(10, 3 * 2 * 3)
    k, v = qkv[:, 6:12].view(10, 2, 3), qkv[:, 12:].view(10, 2, 3)
    slots = slot_mapping(TABLE, torch.arange(10), BLOCK)
    flat = _cache()
    strided = tuple(torch.zeros(8, 2, BLOCK, 6)[..., :3] for _ in range(2))
    assert not strided[0].is_contiguous()
    for rows in (slice(0, 7), slice(7, 10), slice(7, 10)):  # a prefill, a decode batch of 3, and again
        write_kv(*flat, k[rows], v[rows], slots[rows])
        write_kv(*strided, k[rows], v[rows], slots[rows])
    assert torch.equal(flat[0], strided[0]) and torch.equal(flat[1], strided[1])
    torch.testing.assert_close(read_sequence_kv(flat[1], TABLE, 10), v.transpose(0, 1))


def test_write_converts_to_cache_dtype():
    k_cache = torch.zeros(2, 1, BLOCK, 2, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    k = torch.tensor([[[1.5, -2.25]]])
    write_kv(k_cache, v_cache, k, k * 2, torch.tensor([6]))
    assert k_cache.dtype == torch.bfloat16
    torch.testing.assert_close(k_cache[1, 0, 2], torch.tensor([1.5, -2.25], dtype=torch.bfloat16))
    torch.testing.assert_close(v_cache[1, 0, 2], torch.tensor([3.0, -4.5], dtype=torch.bfloat16))


def test_null_slots_lie_in_null_block():
    for count in (1, 3, BLOCK, 2 * BLOCK + 1):
        slots = null_slots(count, BLOCK)
        assert slots.shape == (count,) and slots.dtype == torch.int64
        assert torch.all(slots // BLOCK == NULL_BLOCK)
        assert torch.all(slots >= 0)
    assert null_slots(3, BLOCK).tolist() == [0, 1, 2]
    assert null_slots(6, BLOCK).tolist() == [0, 1, 2, 3, 0, 1]


def test_padding_writes_touch_only_the_null_block():
    torch.manual_seed(0)
    k_cache, v_cache = _cache()
    k_cache.normal_()
    v_cache.normal_()
    before_k, before_v = k_cache.clone(), v_cache.clone()
    # A padded batch: 2 real tokens at the sequence's positions 0 and 1, then 7 padding tokens.
    real = slot_mapping(TABLE, torch.arange(2), BLOCK)
    slots = torch.cat([real, null_slots(7, BLOCK)])
    k, v = torch.randn(9, 2, 3), torch.randn(9, 2, 3)
    write_kv(k_cache, v_cache, k, v, slots)
    torch.testing.assert_close(k_cache[3, :, :2], k[:2].transpose(0, 1))
    torch.testing.assert_close(v_cache[3, :, :2], v[:2].transpose(0, 1))
    changed = (k_cache != before_k).flatten(1).any(1) | (v_cache != before_v).flatten(1).any(1)
    assert changed.nonzero().flatten().tolist() == [0, 3]
    # Within block 3, only the two real slots changed.
    torch.testing.assert_close(k_cache[3, :, 2:], before_k[3, :, 2:])


def test_allocate_kv_cache_per_layer_shapes():
    spec = KVSpec(
        (
            LayerSpec("full", num_kv_heads=2, head_dim=4, dtype=torch.float32),
            LayerSpec("local", num_kv_heads=1, head_dim=8, dtype=torch.bfloat16, sliding_window=16),
            LayerSpec("wide", num_kv_heads=4, head_dim=2, dtype=torch.float16),
        ),
        block_size=BLOCK,
    )
    caches = allocate_kv_cache(spec, num_blocks=5)
    assert list(caches) == ["full", "local", "wide"]
    expected = {
        "full": ((5, 2, BLOCK, 4), torch.float32),
        "local": ((5, 1, BLOCK, 8), torch.bfloat16),
        "wide": ((5, 4, BLOCK, 2), torch.float16),
    }
    for name, (shape, dtype) in expected.items():
        k, v = caches[name]
        assert k.shape == shape and v.shape == shape
        assert k.dtype == dtype and v.dtype == dtype
        assert k.data_ptr() != v.data_ptr()
        assert torch.all(k == 0) and torch.all(v == 0)
    # 2 (K and V) × heads × block × head_dim × itemsize, summed over layers.
    assert spec.bytes_per_block() == 2 * 2 * 4 * 4 * 4 + 2 * 1 * 4 * 8 * 2 + 2 * 4 * 4 * 2 * 2
    assert spec.bytes_per_block() == 256 + 128 + 128


def test_kvspec_rejects_duplicate_names():
    a = LayerSpec("layers.0", 1, 4, torch.float32)
    with pytest.raises(ConfigError, match=r"duplicate layer names \['layers\.0'\]"):
        KVSpec((a, LayerSpec("layers.1", 1, 4, torch.float32), a))


# --- PagedAttention ----------------------------------------------------------------------------------


class _TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = PagedAttention("layers.0.attn", num_heads=4, num_kv_heads=2, head_dim=4)
        self.b = nn.Sequential(
            PagedAttention("layers.1.attn", 2, 1, 8, sliding_window=3, dtype=torch.bfloat16)
        )


def test_bind_rejects_wrong_shape_naming_layer():
    attn = PagedAttention("layers.3.attn", num_heads=4, num_kv_heads=2, head_dim=4)
    good = torch.zeros(3, 2, BLOCK, 4)
    with pytest.raises(ConfigError, match=r"layers\.3\.attn.*\[blocks, 2, block_size, 4\].*K \[3, 2, 4, 8\]"):
        attn.bind(torch.zeros(3, 2, BLOCK, 8), torch.zeros(3, 2, BLOCK, 8))
    with pytest.raises(ConfigError, match=r"layers\.3\.attn"):
        attn.bind(torch.zeros(3, 1, BLOCK, 4), torch.zeros(3, 1, BLOCK, 4))
    with pytest.raises(ConfigError, match=r"layers\.3\.attn.*V \[3, 2, 4, 4\]"):
        attn.bind(torch.zeros(2, 2, BLOCK, 4), good)
    attn.bind(good, good.clone())


def test_forward_before_bind_raises():
    attn = PagedAttention("layers.0.attn", 2, 1, 4)
    q, kv = torch.randn(1, 2, 4), torch.randn(1, 1, 4)
    meta = AttentionMetadata(slot_mapping=torch.tensor([4]), seq_ids=torch.tensor([0]))
    with pytest.raises(ConfigError, match=r"layers\.0\.attn: no KV cache bound"):
        attn(q, kv, kv, meta)


def test_collect_kv_spec_and_bind_kv_caches():
    model = _TwoLayers()
    spec = collect_kv_spec(model, block_size=BLOCK)
    assert spec.block_size == BLOCK
    assert spec.layers == (
        LayerSpec("layers.0.attn", 2, 4, torch.float32, None),
        LayerSpec("layers.1.attn", 1, 8, torch.bfloat16, 3),
    )
    caches = allocate_kv_cache(spec, num_blocks=3)
    bind_kv_caches(model, caches)
    assert model.a.k_cache is caches["layers.0.attn"][0]
    assert model.b[0].v_cache is caches["layers.1.attn"][1]


def test_bind_kv_caches_reports_missing_and_unknown_layers():
    model = _TwoLayers()
    caches = allocate_kv_cache(collect_kv_spec(model, BLOCK), num_blocks=3)
    missing = {"layers.0.attn": caches["layers.0.attn"]}
    with pytest.raises(ConfigError, match=r"missing for layers \['layers\.1\.attn'\]; .*unknown layers \[\]"):
        bind_kv_caches(model, missing)
    extra = {**caches, "layers.9.attn": caches["layers.0.attn"]}
    with pytest.raises(ConfigError, match=r"missing for layers \[\]; .*unknown layers \['layers\.9\.attn'\]"):
        bind_kv_caches(model, extra)
    both = {"layers.0.attn": caches["layers.0.attn"], "bogus": caches["layers.1.attn"]}
    with pytest.raises(ConfigError, match=r"\['layers\.1\.attn'\].*\['bogus'\]"):
        bind_kv_caches(model, both)
    assert model.a.k_cache is None  # nothing bound after a failed bind


@pytest.mark.parametrize("sliding_window", [None, 4])
def test_prefill_then_decode_matches_full_prefill(sliding_window):
    torch.manual_seed(0)
    heads, kv_heads, dim, prompt = 4, 2, 4, 9
    attn = PagedAttention("layers.0.attn", heads, kv_heads, dim, sliding_window=sliding_window)
    spec = collect_kv_spec(attn, BLOCK)
    caches = allocate_kv_cache(spec, num_blocks=8)
    bind_kv_caches(attn, caches)

    total = prompt + 1
    q = torch.randn(total, heads, dim)
    k = torch.randn(total, kv_heads, dim)
    v = torch.randn(total, kv_heads, dim)

    # Prefill the prompt, padded with two tokens that write into the null block.
    pad = 2
    slots = torch.cat([slot_mapping(TABLE, torch.arange(prompt), BLOCK), null_slots(pad, BLOCK)])
    seq_ids = torch.cat([torch.zeros(prompt, dtype=torch.int64), torch.full((pad,), -1)])
    qp = torch.cat([q[:prompt], torch.randn(pad, heads, dim)])
    kp = torch.cat([k[:prompt], torch.randn(pad, kv_heads, dim)])
    vp = torch.cat([v[:prompt], torch.randn(pad, kv_heads, dim)])
    out_prefill = attn(qp, kp, vp, AttentionMetadata(slot_mapping=slots, seq_ids=seq_ids))
    assert out_prefill.shape == (prompt + pad, heads * dim)

    # Decode the next token, batched with one padding row (null block, length 1).
    decode_slots = torch.cat([slot_mapping(TABLE, torch.tensor([prompt]), BLOCK), null_slots(1, BLOCK)])
    meta = AttentionMetadata(
        slot_mapping=decode_slots,
        block_tables=torch.stack([TABLE, torch.zeros(3, dtype=torch.int64)]),
        context_lens=torch.tensor([total, 1]),
    )
    qd = torch.cat([q[prompt:], torch.randn(1, heads, dim)])
    kd = torch.cat([k[prompt:], torch.randn(1, kv_heads, dim)])
    vd = torch.cat([v[prompt:], torch.randn(1, kv_heads, dim)])
    out_decode = attn(qd, kd, vd, meta)
    assert out_decode.shape == (2, heads * dim)
    assert torch.isfinite(out_decode).all()

    ref = ops.prefill_attention(
        q, k, v, torch.zeros(total, dtype=torch.int64), scale=dim**-0.5, sliding_window=sliding_window
    ).reshape(total, heads * dim)
    torch.testing.assert_close(out_decode[0], ref[-1])
    torch.testing.assert_close(out_prefill[:prompt], ref[:prompt])
    # The cache holds the real sequence's K/V despite the padding writes.
    torch.testing.assert_close(read_sequence_kv(caches["layers.0.attn"][0], TABLE, total), k.transpose(0, 1))
