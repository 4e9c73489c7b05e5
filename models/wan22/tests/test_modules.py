"""Tier 1, components: the DiT block, the DiT and the UMT5 encoder against their diffusers/transformers twins.

Weights reach our modules through our own key mappings and loaders (from the saved checkpoint, or from
the reference module's state dict). FP32 must match tightly; BF16 is judged three-way: our BF16 error
against FP32 relative to the reference's own BF16 error.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel
from transformers import UMT5EncoderModel

from trnmodels.core.accuracy import assert_close_three_way, load_from_hf_module
from trnmodels.core.errors import CheckpointError, ConfigError, InputError
from trnmodels.wan22.text_encoder import UMT5Encoder
from trnmodels.wan22.transformer import WanBlock, WanDiT, WanDiTConfig

from .conftest import TINY_DIT, bf16_like_diffusers, build_dit


def dit_inputs(seed: int = 0, batch: int = 2, in_channels: int = 16):
    g = torch.Generator().manual_seed(seed)
    # 2 x 32 tokens: enough elements for the three-way check's error histograms to be stable.
    latents = torch.randn(batch, in_channels, 2, 8, 8, generator=g)
    timestep = torch.tensor([700.0] * batch)
    context = torch.randn(batch, 16, TINY_DIT["text_dim"], generator=g)
    return latents, timestep, context


# --- DiT block ---------------------------------------------------------------------------------


def block_inputs(hf_dit: WanTransformer3DModel, dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    dim = TINY_DIT["num_attention_heads"] * TINY_DIT["attention_head_dim"]
    # Enough elements (4 x 32 tokens) for the error histograms of the three-way check to be stable.
    x = torch.randn(4, 32, dim, generator=g).to(dtype)
    context = torch.randn(4, 16, dim, generator=g).to(dtype)
    temb = torch.randn(4, 6, dim, generator=g).to(dtype)
    rope = hf_dit.rope(torch.zeros(1, 16, 2, 8, 8))
    return x, context, temb, rope


def our_block(hf_block, dtype: torch.dtype) -> WanBlock:
    from trnmodels.core.parallel import get_cp_group, get_tp_group

    block = WanBlock(WanDiTConfig.from_dict(TINY_DIT), dtype, get_tp_group(), get_cp_group())
    return load_from_hf_module(block, hf_block, block.checkpoint_keys(""))


def test_block_fp32_matches_diffusers():
    hf_dit = build_dit(0)
    hf_block = hf_dit.blocks[0]
    x, context, temb, rope = block_inputs(hf_dit, torch.float32)
    with torch.no_grad():
        expected = hf_block(x, context, temb, rope)
        ours = our_block(hf_block, torch.float32)(x, context, temb, (rope[0].float(), rope[1].float()))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


def test_block_bf16_three_way():
    hf_dit = build_dit(0)
    hf_block = hf_dit.blocks[0]
    x, context, temb, rope = block_inputs(hf_dit, torch.float32)
    bf16_block = bf16_like_diffusers(hf_dit).blocks[0]
    bf16 = [t.to(torch.bfloat16) for t in (x, context, temb)]
    with torch.no_grad():
        expected = hf_block(x, context, temb, rope)
        baseline = bf16_block(*bf16, rope)
        ours = our_block(hf_block, torch.bfloat16)(*bf16, (rope[0].float(), rope[1].float()))
    assert ours.dtype == torch.bfloat16
    assert_close_three_way(ours, expected, baseline, name="wan block bf16")


# --- DiT ---------------------------------------------------------------------------------------


def test_dit_fp32_matches_diffusers(tiny_t2v):
    hf = tiny_t2v.reference.transformer
    ours = WanDiT.from_pretrained(tiny_t2v.path / "transformer")
    latents, t, context = dit_inputs()
    with torch.no_grad():
        expected = hf(latents, t, context, return_dict=False)[0]
        got = ours(latents, t, context)
    assert got.shape == expected.shape == latents.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_dit_bf16_three_way(tiny_t2v):
    hf = tiny_t2v.reference.transformer_2
    ours = WanDiT.from_pretrained(tiny_t2v.path / "transformer_2", dtype=torch.bfloat16)
    latents, t, context = dit_inputs(seed=3)
    with torch.no_grad():
        expected = hf(latents, t, context, return_dict=False)[0]
        baseline = bf16_like_diffusers(hf)(latents.bfloat16(), t, context.bfloat16(), return_dict=False)[0]
        got = ours(latents.bfloat16(), t, context.bfloat16())
    assert got.dtype == torch.bfloat16
    assert_close_three_way(got, expected, baseline, name="wan dit bf16")


def test_dit_refuses_bad_inputs_and_configs(tiny_t2v):
    ours = WanDiT.from_pretrained(tiny_t2v.path / "transformer")
    latents, t, context = dit_inputs()
    with pytest.raises(InputError, match="latent height=3 is not divisible by the DiT patch size 2"):
        ours(latents[..., :3, :], t, context)
    with pytest.raises(InputError, match=r"expected \[batch, 16, frames, height, width\]"):
        ours(latents[:, :8], t, context)
    with pytest.raises(ConfigError, match="image_dim"):
        WanDiTConfig.from_dict({**TINY_DIT, "image_dim": 32})
    with pytest.raises(CheckpointError, match="expects shape"):
        WanDiT(WanDiTConfig.from_dict({**TINY_DIT, "ffn_dim": 64})).load_weights(
            tiny_t2v.path / "transformer"
        )


# --- UMT5 text encoder ---------------------------------------------------------------------------


def text_inputs():
    ids = torch.tensor([[0, 17, 42, 99, 250, 1, 2, 2], [0, 5, 6, 7, 8, 9, 10, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    return ids, mask


def test_text_encoder_fp32_matches_transformers(tiny_t2v):
    hf = tiny_t2v.reference.text_encoder
    ours = UMT5Encoder.from_pretrained(tiny_t2v.path / "text_encoder")
    ids, mask = text_inputs()
    with torch.no_grad():
        expected = hf(ids, mask).last_hidden_state
        got = ours(ids, mask).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_text_encoder_bf16_three_way(tiny_t2v):
    path = tiny_t2v.path / "text_encoder"
    hf = tiny_t2v.reference.text_encoder
    baseline_model = UMT5EncoderModel.from_pretrained(path, dtype=torch.bfloat16).eval()
    ours = UMT5Encoder.from_pretrained(path, dtype=torch.bfloat16)
    ids, mask = text_inputs()
    with torch.no_grad():
        expected = hf(ids, mask).last_hidden_state
        baseline = baseline_model(ids, mask).last_hidden_state
        got = ours(ids, mask).last_hidden_state
    # Padding rows are not compared: the pipeline zeroes them, and they carry no meaning.
    real = mask.bool()
    assert_close_three_way(got[real], expected[real], baseline[real], name="umt5 bf16")
