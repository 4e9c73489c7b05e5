"""RoPE frequencies and rotation against transformers' ROPE_INIT_FUNCTIONS and apply_rotary_pos_emb."""

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from trnmodels.core.errors import ConfigError
from trnmodels.core.ops import RopeConfig, apply_rope, cos_sin, inv_freq

HEAD_DIM = 64


def _llama_config(rope_parameters: dict, max_position_embeddings: int = 131072, **kwargs) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=2 * HEAD_DIM,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
        **kwargs,
    )


def _hf_inv_freq(config, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    rope_type = (config.rope_parameters[layer_type] if layer_type else config.rope_parameters)["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    if layer_type is None:
        return ROPE_INIT_FUNCTIONS[rope_type](config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, layer_type=layer_type)


def _ours(config, head_dim: int = HEAD_DIM, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    return inv_freq(RopeConfig.from_hf(config, head_dim, layer_type=layer_type))


def _assert_same(config, head_dim: int = HEAD_DIM, layer_type: str | None = None):
    ours, our_scale = _ours(config, head_dim, layer_type)
    ref, ref_scale = _hf_inv_freq(config, layer_type)
    assert ours.dtype == torch.float32
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref.float())
    assert our_scale == pytest.approx(ref_scale, rel=1e-12)
    return ours, our_scale


# --------------------------------------------------------------------------------------------------
# inv_freq
# --------------------------------------------------------------------------------------------------


def test_default():
    ours, scale = _assert_same(_llama_config({"rope_type": "default", "rope_theta": 10000.0}))
    assert ours.shape == (HEAD_DIM // 2,)
    assert scale == 1.0
    # Independent hand check of the first two frequencies: theta^(-0/D), theta^(-2/D).
    torch.testing.assert_close(ours[:2], torch.tensor([1.0, 10000.0 ** (-2 / HEAD_DIM)]))


LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
}


@pytest.mark.parametrize("original_max", [8192, 32])
def test_llama3(original_max):
    config = _llama_config({**LLAMA3, "original_max_position_embeddings": original_max})
    ours, scale = _assert_same(config)
    assert scale == 1.0

    # Every band must be exercised: kept (short wavelengths), divided by factor (long), blended (between).
    base = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    wavelen = 2 * math.pi / base
    high_band = wavelen < original_max / 4.0
    low_band = wavelen > original_max / 1.0
    medium = ~high_band & ~low_band
    assert high_band.any() and low_band.any() and medium.any()
    torch.testing.assert_close(ours[high_band], base[high_band])
    torch.testing.assert_close(ours[low_band], base[low_band] / 8.0)
    assert ((ours[medium] < base[medium]) & (ours[medium] > base[medium] / 8.0)).all()


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"mscale": 1.0, "mscale_all_dim": 0.5},
        {"mscale": 0.707, "mscale_all_dim": 0.707},
        {"mscale": 0.707},
        {"attention_factor": 1.3},
        {"truncate": False},
        # A long original context puts both beta corrections inside the ramp.
        {"beta_fast": 16.0, "beta_slow": 2.0, "original_max_position_embeddings": 4096},
    ],
    ids=["plain", "mscale", "mscale-equal", "mscale-only", "attention_factor", "no-truncate", "betas"],
)
def test_yarn(extra):
    params = {**YARN, **extra}
    config = _llama_config(params, max_position_embeddings=4 * params["original_max_position_embeddings"])
    ours, scale = _assert_same(config)
    # Hand check of the attention scaling.
    if "attention_factor" in extra:
        assert scale == pytest.approx(1.3)
    elif "mscale_all_dim" in extra:
        num = 0.1 * extra["mscale"] * math.log(4.0) + 1.0
        den = 0.1 * extra["mscale_all_dim"] * math.log(4.0) + 1.0
        assert scale == pytest.approx(num / den)
    else:
        assert scale == pytest.approx(0.1 * math.log(4.0) + 1.0)
    # The fastest frequency extrapolates (unchanged), the slowest interpolates (divided by factor).
    assert ours[0] == pytest.approx(1.0)
    assert ours[-1] == pytest.approx((10000.0 ** (-(HEAD_DIM - 2) / HEAD_DIM)) / 4.0, rel=1e-6)


def test_yarn_factor_from_context_lengths():
    """No explicit factor (DeepSeek style): it is max_position_embeddings / original_max_position_embeddings."""
    config = _llama_config({**YARN, "factor": None}, max_position_embeddings=512)
    _, scale = _assert_same(config)
    assert RopeConfig.from_hf(config, HEAD_DIM).factor == 8.0
    assert scale == pytest.approx(0.1 * math.log(8.0) + 1.0)


def test_yarn_truncate_changes_frequencies():
    """Guard against ``truncate`` being ignored: the two settings must give different frequencies here."""
    t, _ = _ours(_llama_config({**YARN, "truncate": True}, max_position_embeddings=256))
    nt, _ = _ours(_llama_config({**YARN, "truncate": False}, max_position_embeddings=256))
    assert not torch.allclose(t, nt)


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {**LLAMA3, "original_max_position_embeddings": 32},
        {**YARN},
    ],
    ids=["default", "llama3", "yarn"],
)
def test_partial_rotary(params):
    config = _llama_config({**params, "partial_rotary_factor": 0.5}, max_position_embeddings=256)
    if params["rope_type"] == "default":
        # LlamaRotaryEmbedding's default ignores partial_rotary_factor; compare with the generic formula.
        ours, _ = _ours(config)
        dim = HEAD_DIM // 2
        expected = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        torch.testing.assert_close(ours, expected)
    else:
        ours, _ = _assert_same(config)
    assert ours.shape == (HEAD_DIM // 4,)


def test_partial_rotary_from_top_level_config_attribute():
    config = _llama_config({"rope_type": "default", "rope_theta": 10000.0}, partial_rotary_factor=0.5)
    cfg = RopeConfig.from_hf(config, HEAD_DIM)
    assert cfg.partial_rotary_factor == 0.5
    assert inv_freq(cfg)[0].shape == (HEAD_DIM // 4,)


def test_proportional_gemma4():
    gemma4 = pytest.importorskip("transformers.models.gemma4")
    modeling = pytest.importorskip("transformers.models.gemma4.modeling_gemma4")
    config = gemma4.Gemma4TextConfig(
        num_hidden_layers=6, hidden_size=64, num_attention_heads=2, head_dim=32, global_head_dim=64
    )
    full = config.rope_parameters["full_attention"]
    assert full["rope_type"] == "proportional"
    # Full-attention layers use the global head dim (per-layer config), sliding ones the local head dim.
    full_config = config.per_layer_config["full_attention"]
    ours, scale = _assert_same(full_config, head_dim=full_config.head_dim, layer_type="full_attention")
    assert scale == 1.0
    rotated = int(full["partial_rotary_factor"] * 64 // 2)
    assert ours.shape == (32,)
    assert (ours[:rotated] > 0).all() and (ours[rotated:] == 0).all()

    # And both layer types against the buffers the Gemma 4 rotary module itself builds.
    rotary = modeling.Gemma4TextRotaryEmbedding(config)
    for layer_type in ("full_attention", "sliding_attention"):
        head_dim = config.per_layer_config[layer_type].head_dim
        ours, scale = _ours(config, head_dim=head_dim, layer_type=layer_type)
        torch.testing.assert_close(ours, getattr(rotary, f"{layer_type}_inv_freq"))
        assert scale == getattr(rotary, f"{layer_type}_attention_scaling")


def test_proportional_llama_config():
    config = _llama_config({"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    ours, _ = _assert_same(config)
    assert ours.shape == (HEAD_DIM // 2,)
    # The rotated half uses the full head_dim as the exponent's denominator.
    torch.testing.assert_close(ours[1], torch.tensor(10000.0 ** (-2 / HEAD_DIM)))
    assert (ours[HEAD_DIM // 4 :] == 0).all()


def test_proportional_with_factor():
    params = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    plain, _ = _assert_same(_llama_config(params))
    scaled, _ = _assert_same(_llama_config({**params, "factor": 2.0}))
    torch.testing.assert_close(scaled, plain / 2.0)


def test_old_style_rope_scaling_config():
    new = _llama_config({**LLAMA3, "original_max_position_embeddings": 32})
    old = LlamaConfig(
        hidden_size=2 * HEAD_DIM,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling={
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )
    ours_old, _ = _ours(old)
    ours_new, _ = _ours(new)
    torch.testing.assert_close(ours_old, ours_new, atol=0, rtol=0)
    torch.testing.assert_close(ours_old, _hf_inv_freq(old)[0])


# --------------------------------------------------------------------------------------------------
# RopeConfig validation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["low_freq_factor", "high_freq_factor", "original_max_position_embeddings"])
def test_llama3_missing_field_raises(field):
    kwargs = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    del kwargs[field]
    with pytest.raises(ConfigError, match=field):
        RopeConfig(head_dim=HEAD_DIM, theta=500000.0, rope_type="llama3", factor=8.0, **kwargs)


def test_from_hf_llama3_missing_field_raises():
    config = SimpleNamespace(
        rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "high_freq_factor": 4.0},
        max_position_embeddings=8192,
    )
    with pytest.raises(ConfigError, match="low_freq_factor"):
        RopeConfig.from_hf(config, HEAD_DIM)


def test_from_hf_yarn_missing_original_max_raises_config_error():
    config = SimpleNamespace(
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}, max_position_embeddings=4096
    )
    with pytest.raises(ConfigError, match="original_max_position_embeddings"):
        RopeConfig.from_hf(config, HEAD_DIM)


def test_from_hf_unknown_rope_type_raises():
    config = SimpleNamespace(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0})
    with pytest.raises(ConfigError, match="linear"):
        RopeConfig.from_hf(config, HEAD_DIM)


def test_unknown_rope_type_raises():
    with pytest.raises(ConfigError, match="bogus"):
        RopeConfig(head_dim=HEAD_DIM, theta=10000.0, rope_type="bogus")


def test_from_hf_missing_theta_raises():
    with pytest.raises(ConfigError, match="rope_theta"):
        RopeConfig.from_hf(SimpleNamespace(rope_parameters={"rope_type": "default"}), HEAD_DIM)


# --------------------------------------------------------------------------------------------------
# cos_sin + apply_rope
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scaling", [1.0, 1.25])
@torch.no_grad()
def test_apply_rope_matches_hf(scaling):
    torch.manual_seed(0)
    t, h, hkv = 7, 4, 2
    freqs, _ = inv_freq(RopeConfig(head_dim=HEAD_DIM, theta=10000.0))
    positions = torch.tensor([0, 1, 2, 3, 10, 11, 500])
    q = torch.randn(t, h, HEAD_DIM)
    k = torch.randn(t, hkv, HEAD_DIM)

    cos, sin = cos_sin(freqs, positions, scaling=scaling)
    assert cos.shape == (t, HEAD_DIM)

    # HF reference: cos/sin as LlamaRotaryEmbedding.forward builds them, tensors as [B, H, T, D].
    ang = positions.float()[:, None] * freqs[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    ref_cos, ref_sin = (emb.cos() * scaling)[None], (emb.sin() * scaling)[None]
    torch.testing.assert_close(cos, ref_cos[0])
    torch.testing.assert_close(sin, ref_sin[0])
    q_ref, k_ref = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], ref_cos, ref_sin, unsqueeze_dim=1
    )
    torch.testing.assert_close(apply_rope(q, cos, sin), q_ref[0].transpose(0, 1))
    torch.testing.assert_close(apply_rope(k, cos, sin), k_ref[0].transpose(0, 1))


@torch.no_grad()
def test_cos_sin_dtype_cast_once():
    freqs, _ = inv_freq(RopeConfig(head_dim=HEAD_DIM, theta=10000.0))
    positions = torch.arange(5)
    cos32, sin32 = cos_sin(freqs, positions)
    cos16, sin16 = cos_sin(freqs, positions, dtype=torch.bfloat16)
    assert cos16.dtype == torch.bfloat16
    assert torch.equal(cos16, cos32.bfloat16()) and torch.equal(sin16, sin32.bfloat16())


@torch.no_grad()
def test_apply_rope_partial_rotary():
    torch.manual_seed(1)
    t, h = 5, 3
    cfg = RopeConfig(head_dim=HEAD_DIM, theta=10000.0, partial_rotary_factor=0.5)
    freqs, _ = inv_freq(cfg)
    rotary_dim = HEAD_DIM // 2
    cos, sin = cos_sin(freqs, torch.arange(1, t + 1))
    assert cos.shape == (t, rotary_dim)
    x = torch.randn(t, h, HEAD_DIM)
    out = apply_rope(x, cos, sin)
    # The tail passes through bit for bit.
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])
    # The head is a half-split rotation by hand: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
    half = rotary_dim // 2
    x1, x2 = x[..., :half], x[..., half:rotary_dim]
    ang = torch.arange(1, t + 1).float()[:, None, None] * freqs
    expected = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], dim=-1)
    torch.testing.assert_close(out[..., :rotary_dim], expected)
    # Rotation changes the head (position > 0) and preserves each pair's norm.
    assert not torch.allclose(out[..., :rotary_dim], x[..., :rotary_dim])
    torch.testing.assert_close(out[..., :rotary_dim].norm(dim=-1), x[..., :rotary_dim].norm(dim=-1))
