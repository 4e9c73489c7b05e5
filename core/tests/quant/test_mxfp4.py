"""MXFP4 decoding must match transformers bit for bit: the HF gpt-oss model is the plugin's reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

from trnmodels.core.errors import CheckpointError
from trnmodels.core.quant import (
    FP4_E2M1_VALUES,
    dequantize_mxfp4,
    mxfp4_loader,
    quantize_mxfp4,
    validate_mxfp4,
)
from trnmodels.core.testing import quantize_checkpoint_mxfp4, save_checkpoint
from trnmodels.core.testing.published import published_config
from trnmodels.core.weights import CheckpointTensor, StateDictCheckpoint

SHAPES = [(1, 1, 1, 16), (2, 8, 4, 16), (3, 64, 2, 16), (4, 5, 3, 16)]


def _random_packed(shape: tuple[int, ...], lo: int = 110, hi: int = 136, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    scales = torch.randint(lo, hi, shape[:-1], generator=g, dtype=torch.uint8)
    return blocks, scales


def test_values_table_matches_hf() -> None:
    assert list(FP4_E2M1_VALUES) == FP4_VALUES


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequantize_matches_hf(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    blocks, scales = _random_packed(shape)
    ours = dequantize_mxfp4(blocks, scales, dtype)
    ref = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
    e, rows, groups, _ = shape
    assert ours.shape == ref.shape == (e, groups * 32, rows)
    assert ours.dtype == ref.dtype == dtype
    assert torch.equal(ours, ref)


def test_dequantize_full_exponent_range_matches_hf() -> None:
    blocks, scales = _random_packed((2, 16, 4, 16), lo=0, hi=255, seed=1)
    for dtype in (torch.bfloat16, torch.float32):
        ours = dequantize_mxfp4(blocks, scales, dtype)
        ref = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
        assert torch.equal(ours, ref)


def test_low_nibble_is_even_column() -> None:
    blocks = torch.zeros(1, 1, 1, 16, dtype=torch.uint8)
    blocks[..., 0] = 0x72  # low nibble 2 (1.0), high nibble 7 (6.0)
    scales = torch.full((1, 1, 1), 128, dtype=torch.uint8)  # 2**1
    out = dequantize_mxfp4(blocks, scales, torch.float32)
    assert out.shape == (1, 32, 1)
    assert out[0, :2, 0].tolist() == [2.0, 12.0]


def _representable(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    blocks, scales = _random_packed(shape, seed=seed)
    return dequantize_mxfp4(blocks, scales, torch.float32)


@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_exact_for_representable(shape: tuple[int, ...]) -> None:
    w = _representable(shape, seed=2)
    blocks, scales = quantize_mxfp4(w)
    assert blocks.shape == shape and scales.shape == shape[:-1]
    assert blocks.dtype == scales.dtype == torch.uint8
    assert torch.equal(dequantize_mxfp4(blocks, scales, torch.float32), w)


def test_round_trip_random_within_bound() -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3, 128, 24, generator=g) * torch.logspace(-4, 2, 24)  # varied magnitudes per row
    blocks, scales = quantize_mxfp4(w)
    back = dequantize_mxfp4(blocks, scales, torch.float32)
    # Per-element scale 2**e, broadcast back to the [E, cols, rows] layout.
    step = torch.exp2(scales.float() - 127).repeat_interleave(32, dim=-1).transpose(-1, -2)
    m = w.abs() / step
    # E2M1 spacing is 0.5 below 2, 1 in [2, 4) and 2 in [4, 6]; the worst case is half of it.
    half_spacing = torch.where(m < 2, 0.25, torch.where(m < 4, 0.5, 1.0))
    assert ((back - w).abs() <= half_spacing * step).all()
    # The exponent is the smallest that fits each block's max in 6.0 (nothing clipped, no range wasted).
    amax = (w.abs() / step).transpose(-1, -2).reshape(3, 24, 4, 32).amax(-1)
    assert (amax <= 6).all() and (amax > 3).all()


def test_rounding_is_nearest_ties_to_even() -> None:
    w = torch.zeros(32, 1)
    w[:8, 0] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    w[8:16, 0] = -w[:8, 0]
    back = dequantize_mxfp4(*quantize_mxfp4(w[None]), torch.float32)[0, :, 0]
    expected = [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert back[:8].tolist() == expected
    assert back[8:16].tolist() == [-v for v in expected]


@pytest.mark.parametrize("shape", [(2, 64, 48), (4, 32, 8)])
def test_quantized_layout_matches_hf_dequantizer(shape: tuple[int, ...]) -> None:
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(4))
    blocks, scales = quantize_mxfp4(w)
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert ref.shape == w.shape
    assert torch.equal(ref, dequantize_mxfp4(blocks, scales, torch.float32))


def test_quantize_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize_mxfp4(torch.zeros(2, 30, 4))
    with pytest.raises(ValueError, match="inf or nan"):
        quantize_mxfp4(torch.full((1, 32, 1), float("inf")))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            dict(blocks_dtype=torch.int8, scales_dtype=torch.uint8),
            r"L\.gate_up_proj_blocks: .*expected dtype torch\.uint8, got torch\.int8",
        ),
        (
            dict(scales_dtype=torch.float32),
            r"L\.gate_up_proj_scales: .*expected dtype torch\.uint8, got torch\.float32",
        ),
        (
            dict(blocks_shape=(2, 8, 4, 32), scales_shape=(2, 8, 4)),
            r"L\.gate_up_proj_blocks: .*expected \[\.\.\., rows, blocks, 16\], got \[2, 8, 4, 32\]",
        ),
        (
            dict(scales_shape=(2, 8, 5)),
            r"L\.gate_up_proj_scales: .*expected \[2, 8, 4\], got \[2, 8, 5\]",
        ),
    ],
)
def test_validate_errors(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = dict(
        blocks_key="L.gate_up_proj_blocks",
        blocks_shape=(2, 8, 4, 16),
        scales_key="L.gate_up_proj_scales",
        scales_shape=(2, 8, 4),
    )
    with pytest.raises(CheckpointError, match=match):
        validate_mxfp4(**{**args, **kwargs})


def test_loader_errors_name_the_key() -> None:
    blocks, scales = _random_packed((2, 8, 4, 16))
    ckpt = StateDictCheckpoint({"b": blocks.to(torch.int16), "s": scales, "s_bad": scales[:, :, :3]})
    load = mxfp4_loader()
    with pytest.raises(CheckpointError, match=r"b: .*expected dtype torch\.uint8, got torch\.int16"):
        load([ckpt.tensor("b"), ckpt.tensor("s")], 0, 1)
    ckpt = StateDictCheckpoint({"b": blocks, "s_bad": scales[:, :, :3]})
    with pytest.raises(CheckpointError, match=r"s_bad: .*expected \[2, 8, 4\], got \[2, 8, 3\]"):
        load([ckpt.tensor("b"), ckpt.tensor("s_bad")], 0, 1)
    with pytest.raises(CheckpointError, match=r"expects \[blocks, scales\]"):
        load([ckpt.tensor("b")], 0, 1)


class _Recording:
    """A tensor source that records which slices were read."""

    def __init__(self, tensor: torch.Tensor, reads: list[Any]):
        self._tensor, self._reads = tensor, reads

    def get_shape(self) -> list[int]:
        return list(self._tensor.shape)

    def __getitem__(self, index: Any) -> torch.Tensor:
        self._reads.append(index)
        return self._tensor[index]


def test_loader_reads_only_selected_experts() -> None:
    blocks, scales = _random_packed((4, 8, 2, 16))
    reads: list[Any] = []
    tensors = [
        CheckpointTensor(key, "mem", tuple(t.shape), _Recording(t, reads))
        for key, t in (("x_blocks", blocks), ("x_scales", scales))
    ]
    out = mxfp4_loader(experts=slice(1, 3))(tensors, 0, 1)
    assert reads == [slice(1, 3), slice(1, 3)]
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, dequantize_mxfp4(blocks, scales)[1:3])
    full = mxfp4_loader(dtype=torch.float32)(tensors, 0, 1)
    assert torch.equal(full, convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))


def test_hf_loads_our_quantized_checkpoint(tmp_path: Path) -> None:
    """A checkpoint we write in the published layout loads in HF and decodes to what we decode."""
    from transformers import GptOssConfig, GptOssForCausalLM, Mxfp4Config

    config = GptOssConfig(
        hidden_size=64,
        intermediate_size=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        head_dim=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        layer_types=["sliding_attention", "full_attention"],
    )
    torch.manual_seed(0)
    model = GptOssForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_proj_bias"):  # HF initialises them to zero; make their loading observable
                p.normal_()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    save_checkpoint(model, tmp_path / "bf16")
    checkpoint = quantize_checkpoint_mxfp4(
        tmp_path / "bf16",
        tmp_path / "mxfp4",
        weights=("gate_up_proj", "down_proj"),
        modules_to_not_convert=published_config("gpt-oss-20b")["quantization_config"][
            "modules_to_not_convert"
        ],
    )
    packed = load_file(checkpoint / "model.safetensors")
    for key in state:
        if key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            assert f"{key}_blocks" in packed and key not in packed

    loaded = GptOssForCausalLM.from_pretrained(checkpoint, quantization_config=Mxfp4Config(dequantize=True))
    for i in range(config.num_hidden_layers):
        experts = loaded.model.layers[i].mlp.experts
        for proj in ("gate_up_proj", "down_proj"):
            key = f"model.layers.{i}.mlp.experts.{proj}"
            ours = dequantize_mxfp4(packed[f"{key}_blocks"], packed[f"{key}_scales"])
            got = getattr(experts, proj).detach()
            assert got.shape == ours.shape
            # HF keeps the decoded experts in bf16 (model dtype float32); compare values, not dtypes.
            assert torch.equal(got.float(), ours.float())
        assert torch.equal(
            experts.gate_up_proj_bias, state[f"model.layers.{i}.mlp.experts.gate_up_proj_bias"]
        )
