"""Attention ops against transformers' eager attention (Llama, gpt-oss), torch SDPA and hand references."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager
from transformers.models.llama.modeling_llama import eager_attention_forward as llama_eager

from trnmodels.core.accuracy.three_way import assert_close_three_way
from trnmodels.core.cpu import extension
from trnmodels.core.ops import attention, decode_attention, prefill_attention
from trnmodels.core.ops.dispatch import select_backend

D = 16
SCALE = D**-0.5


# --------------------------------------------------------------------------------------------------
# References. Our layout is flat tokens [T, H, D]; transformers' is [B, H, T, D] in, [B, T, H, D] out.
# --------------------------------------------------------------------------------------------------


def _causal(t: int) -> torch.Tensor:
    i = torch.arange(t)
    return i[:, None] >= i[None, :]


def _window(t: int, w: int) -> torch.Tensor:
    i = torch.arange(t)
    delta = i[:, None] - i[None, :]
    return (delta >= 0) & (delta < w)


def _additive(visible: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean [Tq, Tk] (True = may attend) → additive [1, 1, Tq, Tk] mask of 0 / -inf."""
    mask = torch.zeros(visible.shape, dtype=dtype)
    return mask.masked_fill(~visible, float("-inf"))[None, None]


def _module(h: int, hkv: int, sinks: torch.Tensor | None = None) -> SimpleNamespace:
    return SimpleNamespace(num_key_value_groups=h // hkv, training=False, sinks=sinks)


def _hf(eager, q, k, v, visible, scale=SCALE, sinks=None):
    """Run a transformers eager attention on flat [T, H, D] tensors; returns [T, H, D]."""
    out, _ = eager(
        _module(q.shape[1], k.shape[1], sinks),
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        _additive(visible, q.dtype),
        scaling=scale,
    )
    return out[0]


def _hand(q, k, v, visible, scale, softcap=None):
    """Textbook attention: scores*scale, cap*tanh(s/cap), mask, softmax, @v (K/V heads repeated)."""
    groups = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, kr) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vr)


def _qkv(t: int, h: int, hkv: int, seed: int = 0, dtype=torch.float32, spread: float = 1.0):
    torch.manual_seed(seed)
    q = torch.randn(t, h, D) * spread
    k = torch.randn(t, hkv, D) * spread
    v = torch.randn(t, hkv, D)
    return q.to(dtype), k.to(dtype), v.to(dtype)


# --------------------------------------------------------------------------------------------------
# prefill_attention
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hkv", [8, 2, 1], ids=["MHA", "GQA", "MQA"])
@torch.no_grad()
def test_prefill_single_sequence_matches_llama_eager(hkv):
    t, h = 9, 8
    q, k, v = _qkv(t, h, hkv)
    out = prefill_attention(q, k, v, torch.zeros(t, dtype=torch.long), scale=SCALE)
    assert out.shape == (t, h, D)
    torch.testing.assert_close(out, _hf(llama_eager, q, k, v, _causal(t)))


@torch.no_grad()
def test_prefill_ragged_batch_equals_separate_sequences():
    h, hkv = 8, 2
    seq_ids = torch.tensor([0, 0, 0, 1, 1, 1, 1, -1, -1])
    q, k, v = _qkv(len(seq_ids), h, hkv, seed=1)
    out = prefill_attention(q, k, v, seq_ids, scale=SCALE)

    for sid in (0, 1):
        rows = seq_ids == sid
        alone = prefill_attention(
            q[rows], k[rows], v[rows], torch.zeros(int(rows.sum()), dtype=torch.long), scale=SCALE
        )
        torch.testing.assert_close(out[rows], alone)
        torch.testing.assert_close(out[rows], _hf(llama_eager, q[rows], k[rows], v[rows], _causal(3 + sid)))

    # Padding rows are finite (each sees at least itself).
    assert torch.isfinite(out[seq_ids < 0]).all()

    # Padding tokens' K/V never leak into real tokens.
    k2, v2 = k.clone(), v.clone()
    k2[seq_ids < 0] = 100.0 * torch.randn_like(k2[seq_ids < 0])
    v2[seq_ids < 0] = 100.0 * torch.randn_like(v2[seq_ids < 0])
    out2 = prefill_attention(q, k2, v2, seq_ids, scale=SCALE)
    real = seq_ids >= 0
    torch.testing.assert_close(out2[real], out[real], atol=0, rtol=0)
    # ...but they do reach the padding row itself (guards against the test being vacuous).
    assert not torch.allclose(out2[~real], out[~real])


@pytest.mark.parametrize("window", [1, 3, 5])
@torch.no_grad()
def test_prefill_sliding_window(window):
    t, h, hkv = 10, 4, 2
    q, k, v = _qkv(t, h, hkv, seed=2)
    out = prefill_attention(q, k, v, torch.zeros(t, dtype=torch.long), scale=SCALE, sliding_window=window)
    torch.testing.assert_close(out, _hf(llama_eager, q, k, v, _window(t, window)))
    if window < t:
        assert not torch.allclose(out, _hf(llama_eager, q, k, v, _causal(t)))


@torch.no_grad()
def test_prefill_sliding_window_ragged():
    h, hkv, w = 4, 2, 2
    seq_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1])
    q, k, v = _qkv(len(seq_ids), h, hkv, seed=3)
    out = prefill_attention(q, k, v, seq_ids, scale=SCALE, sliding_window=w)
    for sid in (0, 1):
        rows = seq_ids == sid
        n = int(rows.sum())
        torch.testing.assert_close(out[rows], _hf(llama_eager, q[rows], k[rows], v[rows], _window(n, w)))


@pytest.mark.parametrize(
    ("scale", "softcap"),
    [(0.5, None), (SCALE, 5.0), (0.3, 2.0)],
    ids=["scale", "softcap", "scale+softcap"],
)
@torch.no_grad()
def test_prefill_scale_and_softcap_hand_reference(scale, softcap):
    t, h, hkv = 8, 4, 2
    q, k, v = _qkv(t, h, hkv, seed=4, spread=3.0)  # large logits, so the cap actually bites
    seq_ids = torch.zeros(t, dtype=torch.long)
    out = prefill_attention(q, k, v, seq_ids, scale=scale, softcap=softcap)
    torch.testing.assert_close(out, _hand(q, k, v, _causal(t), scale, softcap))
    if softcap is not None:
        assert not torch.allclose(out, _hand(q, k, v, _causal(t), scale, None), atol=1e-3)


@pytest.mark.parametrize("window", [None, 3], ids=["causal", "sliding"])
@torch.no_grad()
def test_prefill_sinks_match_gpt_oss(window):
    t, h, hkv = 8, 8, 2
    q, k, v = _qkv(t, h, hkv, seed=5)
    sinks = torch.randn(h) * 2.0
    out = prefill_attention(
        q, k, v, torch.zeros(t, dtype=torch.long), scale=SCALE, sliding_window=window, sinks=sinks
    )
    visible = _causal(t) if window is None else _window(t, window)
    torch.testing.assert_close(out, _hf(gpt_oss_eager, q, k, v, visible, sinks=sinks))
    # Sinks only add mass to the denominator: the output must differ from plain attention.
    assert not torch.allclose(out, _hf(llama_eager, q, k, v, visible), atol=1e-3)


@torch.no_grad()
def test_prefill_bf16_three_way():
    t, h, hkv = 16, 8, 2
    q, k, v = _qkv(t, h, hkv, seed=6, dtype=torch.bfloat16, spread=2.0)
    target = prefill_attention(q, k, v, torch.zeros(t, dtype=torch.long), scale=SCALE)
    assert target.dtype == torch.bfloat16
    expected = _hf(llama_eager, q.float(), k.float(), v.float(), _causal(t))
    baseline = _hf(llama_eager, q, k, v, _causal(t))
    assert baseline.dtype == torch.bfloat16
    assert_close_three_way(target, expected, baseline, name="prefill_attention bf16")


# --------------------------------------------------------------------------------------------------
# decode_attention on a paged cache
# --------------------------------------------------------------------------------------------------

BLOCK = 4
NUM_BLOCKS = 9
MAX_BLOCKS = 3
LENS = (6, 11)


def _paged_setup(h: int, hkv: int, seed: int, lens: tuple[int, ...] = LENS):
    """Sequences written into a shuffled paged cache (block 0 unused); returns per-seq Q/K/V too."""
    torch.manual_seed(seed)
    seqs = [(torch.randn(n, h, D), torch.randn(n, hkv, D), torch.randn(n, hkv, D)) for n in lens]
    # Garbage everywhere, so anything read outside the context shows up.
    k_cache = 50.0 * torch.randn(NUM_BLOCKS, hkv, BLOCK, D)
    v_cache = 50.0 * torch.randn(NUM_BLOCKS, hkv, BLOCK, D)
    blocks = (torch.randperm(NUM_BLOCKS - 1) + 1).tolist()
    block_tables = torch.zeros(len(lens), MAX_BLOCKS, dtype=torch.long)  # unused entries point at block 0
    for b, (n, (_, k, v)) in enumerate(zip(lens, seqs, strict=True)):
        for j in range(-(-n // BLOCK)):
            block_tables[b, j] = blocks.pop()
        for p in range(n):
            blk, off = block_tables[b, p // BLOCK], p % BLOCK
            k_cache[blk, :, off] = k[p]
            v_cache[blk, :, off] = v[p]
    return seqs, k_cache, v_cache, block_tables, torch.tensor(lens)


@pytest.mark.parametrize(
    "opts",
    [{}, {"sliding_window": 3}, {"softcap": 4.0, "sinks": True}, {"sliding_window": 5, "sinks": True}],
    ids=["causal", "sliding", "sinks+softcap", "sliding+sinks"],
)
@pytest.mark.parametrize("hkv", [2, 1], ids=["GQA", "MQA"])
@torch.no_grad()
def test_decode_matches_prefill_last_token(opts, hkv):
    h = 8
    seqs, k_cache, v_cache, block_tables, context_lens = _paged_setup(h, hkv, seed=7)
    opts = dict(opts)
    if opts.pop("sinks", False):
        opts["sinks"] = torch.randn(h)
    q_last = torch.stack([q[-1] for q, _, _ in seqs])
    out = decode_attention(q_last, k_cache, v_cache, block_tables, context_lens, scale=SCALE, **opts)
    assert out.shape == (len(LENS), h, D)
    for b, (q, k, v) in enumerate(seqs):
        ref = prefill_attention(q, k, v, torch.zeros(len(q), dtype=torch.long), scale=SCALE, **opts)
        torch.testing.assert_close(out[b], ref[-1])
    if "sinks" in opts and "sliding_window" not in opts:
        # Independent check of the sinks path via gpt-oss (no softcap there, so compare without it).
        plain = decode_attention(
            q_last, k_cache, v_cache, block_tables, context_lens, scale=SCALE, sinks=opts["sinks"]
        )
        for b, (q, k, v) in enumerate(seqs):
            hf = _hf(gpt_oss_eager, q, k, v, _causal(len(q)), sinks=opts["sinks"])
            torch.testing.assert_close(plain[b], hf[-1])


def _skip_without_core_kernel() -> None:
    reason = extension.why_unavailable()
    if reason is not None:
        pytest.skip(f"core's C++ kernels cannot run here: {reason}")


@pytest.fixture(params=["core", "sdpa"])
def decode_kernel(request, monkeypatch):
    """Which CPU kernel runs ``decode_attention``: core's C++ kernel, or, as where core's library cannot be
    built, the eager fallback through torch's fused attention."""
    if request.param == "core":
        _skip_without_core_kernel()
    else:
        monkeypatch.setattr(
            extension, "why_unavailable", lambda: "not built (the test asks for the fallback)"
        )
    return request.param


@pytest.fixture
def core_kernel():
    """Core's C++ kernel runs ``decode_attention``."""
    _skip_without_core_kernel()


@pytest.mark.parametrize("opts", [{}, {"sliding_window": 3}], ids=["causal", "sliding"])
@torch.no_grad()
def test_decode_cpu_kernel_reads_only_the_blocks_the_batch_filled(monkeypatch, opts, decode_kernel):
    """A context bucket wider than the batch: its extra columns point at a block of NaN. The reference
    multiplies their zero weights by NaN; the kernel leaves the blocks out and matches the prefill."""
    h = 8
    seqs, k_cache, v_cache, block_tables, context_lens = _paged_setup(h, 2, seed=3)
    unused = min(set(range(1, NUM_BLOCKS)) - set(block_tables.flatten().tolist()))
    k_cache[unused], v_cache[unused] = float("nan"), float("nan")
    wide = torch.cat([block_tables, torch.full((len(LENS), 2), unused)], dim=1)
    q_last = torch.stack([q[-1] for q, _, _ in seqs])
    args = (q_last, k_cache, v_cache, wide, context_lens)
    assert select_backend("decode_attention", *args) == "cpu"
    out = decode_attention(*args, scale=SCALE, **opts)
    for b, (q, k, v) in enumerate(seqs):
        ref = prefill_attention(q, k, v, torch.zeros(len(q), dtype=torch.long), scale=SCALE, **opts)
        torch.testing.assert_close(out[b], ref[-1])
    assert decode_attention.reference(*args, scale=SCALE, **opts).isnan().all()
    monkeypatch.setenv("TRNMODELS_CPU_KERNELS", "none")
    assert decode_attention(*args, scale=SCALE, **opts).isnan().all()


def _floats_as(dtype: torch.dtype, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The floating-point tensors in ``dtype``, the rest (block tables, lengths) as they are."""
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)


@pytest.mark.parametrize(
    "opts",
    [{}, {"sliding_window": 3}, {"softcap": 4.0, "sinks": True}, {"sliding_window": 5, "sinks": True}],
    ids=["causal", "sliding", "sinks+softcap", "sliding+sinks"],
)
@pytest.mark.parametrize(
    "lens", [(6, 11), (7, 7), (8, 8), (1, 12)], ids=["ragged", "equal", "block-aligned", "one-token"]
)
@pytest.mark.parametrize("hkv", [2, 1], ids=["GQA", "MQA"])
@torch.no_grad()
def test_decode_cpu_kernel_matches_the_reference_fp32_and_bf16(opts, lens, hkv, decode_kernel):
    """Each kernel against the reference: FP32 as close as the reference is to a float64 truth, BF16
    within the three-way bounds of the reference's own BF16 error. The fallback's equal lengths take its
    unmasked path, ragged ones and a window the masked one; softcapping and sinks its reference."""
    h = 8
    seqs, k_cache, v_cache, block_tables, context_lens = _paged_setup(h, hkv, seed=5, lens=lens)
    opts = dict(opts)
    if opts.pop("sinks", False):
        opts["sinks"] = torch.randn(h)
    q_last = torch.stack([q[-1] for q, _, _ in seqs])
    args = (q_last, k_cache, v_cache, block_tables, context_lens)
    assert select_backend("decode_attention", *args) == "cpu"
    kernel = decode_attention(*args, scale=SCALE, **opts)
    reference = decode_attention.reference(*args, scale=SCALE, **opts)
    truth = decode_attention.reference(*_floats_as(torch.float64, args), scale=SCALE, **opts)
    assert (kernel.double() - truth).abs().max() <= 2 * (reference.double() - truth).abs().max() + 1e-6
    torch.testing.assert_close(kernel, reference)
    bf16 = _floats_as(torch.bfloat16, args)
    bf16_opts = {**opts, "sinks": opts["sinks"].bfloat16()} if "sinks" in opts else opts
    target = decode_attention(*bf16, scale=SCALE, **bf16_opts)
    assert target.dtype == torch.bfloat16
    f64_opts = {**opts, "sinks": bf16_opts["sinks"].double()} if "sinks" in opts else opts
    expected = decode_attention.reference(*_floats_as(torch.float64, bf16), scale=SCALE, **f64_opts)
    baseline = decode_attention.reference(*bf16, scale=SCALE, **bf16_opts)
    assert_close_three_way(target, expected, baseline, name="decode attention cpu kernel bf16")


@torch.no_grad()
def test_decode_cpu_kernel_cuts_positions_past_the_longest_context(decode_kernel):
    """Positions past every row's length inside the last live block are left out, not masked: NaN there
    (a block's unwritten tail may hold anything) reaches neither row, where the reference's masked
    weights multiply it."""
    h = 8
    seqs, k_cache, v_cache, block_tables, context_lens = _paged_setup(h, 2, seed=4, lens=(7, 7))
    for table in block_tables:
        k_cache[table[1], :, 3], v_cache[table[1], :, 3] = float("nan"), float("nan")  # position 7
    q_last = torch.stack([q[-1] for q, _, _ in seqs])
    out = decode_attention(q_last, k_cache, v_cache, block_tables, context_lens, scale=SCALE)
    for b, (q, k, v) in enumerate(seqs):
        torch.testing.assert_close(out[b], _hand(q, k, v, _causal(len(q)), SCALE)[-1])
    assert (
        decode_attention.reference(q_last, k_cache, v_cache, block_tables, context_lens, scale=SCALE)
        .isnan()
        .all()
    )


@pytest.mark.parametrize("d, dv", [(20, 20), (136, 136), (64, 72), (3, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_core_decode_kernel_head_sizes_off_its_vector_width(d, dv, dtype, core_kernel):
    """Head sizes that are not a whole number of its 8-lane vectors, or past its 64-column blocks, and a
    value size unlike the key's: against the reference (three-way in BF16) and a hand computation."""
    torch.manual_seed(11)
    lens, h, hkv = (5, 13, 1), 6, 3
    q = torch.randn(len(lens), h, d)
    k_cache, v_cache = torch.randn(NUM_BLOCKS, hkv, BLOCK, d), torch.randn(NUM_BLOCKS, hkv, BLOCK, dv)
    block_tables = torch.stack([torch.randperm(NUM_BLOCKS)[:4] for _ in lens])
    args = (q, k_cache, v_cache, block_tables, torch.tensor(lens))
    if dtype == torch.float32:
        out = decode_attention(*args, scale=0.3)
        for b, n in enumerate(lens):
            keys = k_cache[block_tables[b]].transpose(0, 1).reshape(hkv, -1, d)[:, :n]
            values = v_cache[block_tables[b]].transpose(0, 1).reshape(hkv, -1, dv)[:, :n]
            k, v = keys.transpose(0, 1), values.transpose(0, 1)
            hand = _hand(q[b][None], k, v, torch.ones(1, n, dtype=torch.bool), 0.3)[0]
            torch.testing.assert_close(out[b], hand)
    else:
        bf16 = _floats_as(dtype, args)
        expected = decode_attention.reference(*_floats_as(torch.float64, bf16), scale=0.3)
        baseline = decode_attention.reference(*bf16, scale=0.3)
        assert_close_three_way(decode_attention(*bf16, scale=0.3), expected, baseline, name="decode bf16")


@torch.no_grad()
def test_core_decode_kernel_names_a_bad_block_table_or_length(core_kernel):
    """A block past the cache, or a length past the table, would read outside the cache: refused by name."""
    seqs, k_cache, v_cache, block_tables, context_lens = _paged_setup(8, 2, seed=9)
    q_last = torch.stack([q[-1] for q, _, _ in seqs])
    bad = block_tables.clone()
    bad[1, 2] = NUM_BLOCKS
    with pytest.raises(RuntimeError, match=f"sequence 1 names block {NUM_BLOCKS} of a cache of {NUM_BLOCKS}"):
        decode_attention(q_last, k_cache, v_cache, bad, context_lens, scale=SCALE)
    too_long = torch.tensor([6, MAX_BLOCKS * BLOCK + 1])
    with pytest.raises(
        RuntimeError, match="sequence 1 has context length 13, more than its block table's 12"
    ):
        decode_attention(q_last, k_cache, v_cache, block_tables, too_long, scale=SCALE)
    # Under a sliding window of 3, sequence 1 (11 positions) reads only its third block: the first two
    # are neither read nor checked, and a bad one in the window is still refused.
    outside = block_tables.clone()
    outside[1, :2] = NUM_BLOCKS
    torch.testing.assert_close(
        decode_attention(q_last, k_cache, v_cache, outside, context_lens, scale=SCALE, sliding_window=3),
        decode_attention(q_last, k_cache, v_cache, block_tables, context_lens, scale=SCALE, sliding_window=3),
        rtol=0,
        atol=0,
    )
    with pytest.raises(RuntimeError, match=f"sequence 1 names block {NUM_BLOCKS} of a cache of {NUM_BLOCKS}"):
        decode_attention(q_last, k_cache, v_cache, bad, context_lens, scale=SCALE, sliding_window=3)


@torch.no_grad()
def test_core_decode_kernel_is_what_a_captured_graph_calls(decode_kernel):
    """torch.export of a decode-attention call holds core's op where the library runs (the compiled decode
    graphs call it), the reference's ops where it does not; both give the eager result."""

    class Step(torch.nn.Module):
        def forward(self, q, k_cache, v_cache, block_tables, context_lens):
            return decode_attention(
                q, k_cache, v_cache, block_tables, context_lens, scale=SCALE, sliding_window=5
            )

    seqs, k_cache, v_cache, block_tables, context_lens = _paged_setup(8, 2, seed=12)
    args = (torch.stack([q[-1] for q, _, _ in seqs]), k_cache, v_cache, block_tables, context_lens)
    program = torch.export.export(Step(), args, strict=True)  # as the compile driver captures
    calls_core = "trnmodels_cpu.decode_attention" in str(program.graph)
    assert calls_core == (decode_kernel == "core")
    torch.testing.assert_close(program.module()(*args), Step()(*args))


# --------------------------------------------------------------------------------------------------
# attention: batched non-causal / cross attention
# --------------------------------------------------------------------------------------------------


def _sdpa(q, k, v, scale, attn_mask=None, is_causal=False):
    """torch SDPA on our [B, T, H, D] layout."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=attn_mask,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2)


@pytest.mark.parametrize(
    ("tq", "tk"), [(7, 7), (5, 9), (9, 3)], ids=["self", "cross-short-q", "cross-long-q"]
)
@pytest.mark.parametrize("hkv", [4, 2], ids=["MHA", "GQA"])
@torch.no_grad()
def test_attention_matches_sdpa(tq, tk, hkv):
    torch.manual_seed(8)
    b, h = 2, 4
    q, k, v = torch.randn(b, tq, h, D), torch.randn(b, tk, hkv, D), torch.randn(b, tk, hkv, D)
    # The reference (the CPU kernel is torch's SDPA itself: it is checked against the reference below).
    out = attention.reference(q, k, v, scale=SCALE)
    assert out.shape == (b, tq, h, D)
    torch.testing.assert_close(out, _sdpa(q, k, v, SCALE))


@pytest.mark.parametrize(("tq", "tk"), [(40, 40), (33, 7)], ids=["self", "cross"])
@pytest.mark.parametrize("hkv", [4, 2], ids=["MHA", "GQA"])
@torch.no_grad()
def test_attention_cpu_kernel_matches_the_reference(monkeypatch, tq, tk, hkv):
    """The fused CPU kernel takes unmasked calls; against a float64 truth its FP32 error stays at the
    reference's, and in BF16 within the three-way bounds of the reference's own BF16 error."""
    torch.manual_seed(12)
    b, h = 2, 4
    q, k, v = (torch.randn(b, t, n, D) * 2 for t, n in ((tq, h), (tk, hkv), (tk, hkv)))
    assert select_backend("attention", q, k, v, scale=SCALE) == "cpu"
    truth = attention.reference(q.double(), k.double(), v.double(), scale=SCALE)
    kernel, reference = attention(q, k, v, scale=SCALE), attention.reference(q, k, v, scale=SCALE)
    kernel_error = (kernel.double() - truth).abs().max().item()
    assert kernel_error <= 2 * (reference.double() - truth).abs().max().item() + 1e-7
    torch.testing.assert_close(kernel, reference)
    q16, k16, v16 = (t.bfloat16() for t in (q, k, v))
    target = attention(q16, k16, v16, scale=SCALE)
    assert target.dtype == torch.bfloat16
    expected = attention.reference(q16.double(), k16.double(), v16.double(), scale=SCALE)
    baseline = attention.reference(q16, k16, v16, scale=SCALE)
    assert_close_three_way(target, expected, baseline, name="attention cpu kernel bf16")
    # Masks, softcapping and sinks keep the reference; TRNMODELS_CPU_KERNELS=none turns the kernel off.
    kpm = torch.ones(b, tk, dtype=torch.bool)
    assert select_backend("attention", q, k, v, scale=SCALE, key_padding_mask=kpm) == "torch"
    assert select_backend("attention", q, k, v, scale=SCALE, causal=True) == "torch"
    assert select_backend("attention", q, k, v, scale=SCALE, softcap=5.0) == "torch"
    monkeypatch.setenv("TRNMODELS_CPU_KERNELS", "none")
    assert select_backend("attention", q, k, v, scale=SCALE) == "torch"


@torch.no_grad()
def test_attention_different_value_dim():
    torch.manual_seed(9)
    q, k, v = torch.randn(1, 4, 2, D), torch.randn(1, 6, 2, D), torch.randn(1, 6, 2, 8)
    out = attention(q, k, v, scale=0.2)
    assert out.shape == (1, 4, 2, 8)
    torch.testing.assert_close(out, _sdpa(q, k, v, 0.2))


@torch.no_grad()
def test_attention_key_padding_mask():
    torch.manual_seed(10)
    b, tq, tk, h, hkv = 2, 5, 6, 4, 2
    q, k, v = torch.randn(b, tq, h, D), torch.randn(b, tk, hkv, D), torch.randn(b, tk, hkv, D)
    kpm = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    out = attention(q, k, v, scale=SCALE, key_padding_mask=kpm)
    torch.testing.assert_close(out, _sdpa(q, k, v, SCALE, attn_mask=kpm[:, None, None, :]))
    # Padded keys are ignored: sequence 1 equals attention over its 3 real keys only.
    torch.testing.assert_close(out[1:], attention(q[1:], k[1:, :3], v[1:, :3], scale=SCALE))


@torch.no_grad()
def test_attention_causal():
    torch.manual_seed(11)
    b, t, h, hkv = 2, 6, 4, 2
    q, k, v = torch.randn(b, t, h, D), torch.randn(b, t, hkv, D), torch.randn(b, t, hkv, D)
    out = attention(q, k, v, scale=SCALE, causal=True)
    torch.testing.assert_close(out, _sdpa(q, k, v, SCALE, is_causal=True))
    # Causal + key padding: both masks apply.
    kpm = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1]], dtype=torch.bool)
    both = _causal(t)[None, None] & kpm[:, None, None, :]
    out = attention(q, k, v, scale=SCALE, causal=True, key_padding_mask=kpm)
    torch.testing.assert_close(out, _sdpa(q, k, v, SCALE, attn_mask=both))


# --------------------------------------------------------------------------------------------------
# attention_matmul: the scores and weighted sums of every entry point
# --------------------------------------------------------------------------------------------------


def test_bf16_attention_matmuls_run_in_fp32_on_a_cpu_without_bf16_arithmetic(monkeypatch):
    from trnmodels.core.cpu import linear as cpu_linear
    from trnmodels.core.ops.attention import attention_matmul

    gen = torch.Generator().manual_seed(7)
    a = torch.randn(32, 3, 64, generator=gen).bfloat16()
    b = torch.randn(32, 64, 256, generator=gen).bfloat16()
    truth = a.double() @ b.double()
    monkeypatch.setattr(cpu_linear, "_BF16_IN_HARDWARE", False)
    assert select_backend("attention_matmul", a, b) == "cpu"
    got = attention_matmul(a, b)
    assert got.dtype == torch.bfloat16 and got.shape == truth.shape
    # Rounded once to BF16 (half a unit in the last place, 2**-8 of the value) after FP32 sums.
    slack = 64 * 2**-24 * (a.double().abs() @ b.double().abs())
    assert ((got.double() - truth).abs() <= 2**-8 * truth.abs() + slack).all()
    # FP32 operands, and a CPU with BF16 arithmetic, keep the plain matmul.
    assert select_backend("attention_matmul", a.float(), b.float()) == "torch"
    monkeypatch.setattr(cpu_linear, "_BF16_IN_HARDWARE", True)
    assert select_backend("attention_matmul", a, b) == "torch"


def test_a_graph_converts_the_transposed_keys_in_their_memory_order():
    """The scores' keys reach the kernel as ``k.transpose(-1, -2)`` of a gather from the paged cache. Compiled,
    their conversion to FP32 must write the keys as they lie, ``[..., context, D]``, and the batched matmul
    read them transposed. Inductor otherwise allocates the transposed shape ``[..., D, context]`` and fills
    it one strided element at a time from the cache."""
    from torch._inductor.utils import run_and_get_code

    from trnmodels.core.cpu.attention import attention_matmul as kernel

    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(16, 2, 8, 64, generator=gen).bfloat16()  # [blocks, KV heads, block size, D]
    q = torch.randn(2, 2, 3, 64, generator=gen).bfloat16()  # [batch, KV heads, queries per head, D]
    tables = torch.tensor([[5, 1], [9, 12]], dtype=torch.int64)

    def keys(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        # The reference's gather: [batch, blocks, KV heads, block size, D] to [batch, KV heads, context, D].
        k = cache.index_select(0, tables.flatten()).view(2, 2, 2, 8, 64).transpose(1, 2)
        return k.reshape(2, 2, 16, 64)

    def scores(q: torch.Tensor, cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        return kernel(q, keys(cache, tables).transpose(-1, -2))

    torch._dynamo.reset()
    got, code = run_and_get_code(torch.compile(scores, backend="inductor", fullgraph=True), q, cache, tables)
    wrapper = "".join(code)
    assert "empty_strided_cpu((2, 2, 16, 64)" in wrapper and "empty_strided_cpu((2, 2, 64, 16)" not in wrapper
    k = keys(cache, tables).double()
    truth = q.double() @ k.mT
    slack = 64 * 2**-24 * (q.double().abs() @ k.abs().mT)
    assert ((got.double() - truth).abs() <= 2**-8 * truth.abs() + slack).all()
