"""MXFP4 (OCP microscaling FP4) as published in the gpt-oss checkpoints.

Storage, per weight ``W`` of logical shape ``[..., rows, cols]`` (``rows`` = output features):

* ``*_blocks``: uint8 ``[..., rows, cols // 32, 16]``; each byte packs two FP4 E2M1 codes, the even
  column in the low nibble and the odd column in the high nibble.
* ``*_scales``: uint8 ``[..., rows, cols // 32]``; an E8M0 exponent biased by 127 shared by the 32
  columns of one block, so an element is ``FP4_E2M1_VALUES[code] * 2 ** (scale - 127)``.

``dequantize_mxfp4`` returns the transpose, ``[..., cols, rows]``, because that is the layout the HF
gpt-oss experts use (``gate_up_proj`` is ``[experts, hidden, 2 * intermediate]``, i.e. ``[E, in, out]``)
and what ``transformers.integrations.mxfp4.convert_moe_packed_tensors`` produces; matching it bit for bit
lets the HF model serve as the reference for our plugin. ``quantize_mxfp4`` takes that same layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import CheckpointError
from ..weights.checkpoint import CheckpointTensor
from ..weights.loaders import WeightLoader

MXFP4_BLOCK = 32
"""Elements sharing one scale; 16 packed bytes."""

FP4_E2M1_VALUES: tuple[float, ...] = (
    +0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)  # fmt: skip
"""Value of each 4-bit code: bit 3 is the sign, bits 0-2 index the magnitudes."""

_E8M0_BIAS = 127
_FP4_MAX = 6.0
_MAGNITUDES = torch.tensor(FP4_E2M1_VALUES[:8])
_MIDPOINTS = (_MAGNITUDES[1:] + _MAGNITUDES[:-1]) / 2


def validate_mxfp4(
    blocks_key: str,
    blocks_shape: Sequence[int],
    scales_key: str,
    scales_shape: Sequence[int],
    blocks_dtype: torch.dtype | None = None,
    scales_dtype: torch.dtype | None = None,
) -> None:
    """Reject a blocks/scales pair that is not MXFP4, before it decodes into silently wrong weights.

    Dtypes are optional so shapes can be checked from checkpoint headers before anything is read.
    """
    for key, dtype in ((blocks_key, blocks_dtype), (scales_key, scales_dtype)):
        if dtype is not None and dtype != torch.uint8:
            raise CheckpointError(
                f"{key}: MXFP4 tensors hold packed bytes, expected dtype torch.uint8, got {dtype}"
            )
    if len(blocks_shape) < 3 or blocks_shape[-1] != MXFP4_BLOCK // 2:
        raise CheckpointError(
            f"{blocks_key}: MXFP4 blocks pack {MXFP4_BLOCK} FP4 values in {MXFP4_BLOCK // 2} bytes, "
            f"expected [..., rows, blocks, {MXFP4_BLOCK // 2}], got {list(blocks_shape)}"
        )
    if tuple(scales_shape) != tuple(blocks_shape[:-1]):
        raise CheckpointError(
            f"{scales_key}: MXFP4 scales must have the shape of {blocks_key} without its last dim, "
            f"expected {list(blocks_shape[:-1])}, got {list(scales_shape)}"
        )


def _dequantize_one(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, G, 16]`` + ``[rows, G]`` -> ``[G * 32, rows]``."""
    # Decode in float32: code values have two significant bits and the scale is a power of two,
    # so every product is exact there and the single cast to ``dtype`` rounds like HF's ldexp does.
    lut = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-2).long()  # [rows, G, 32]
    values = lut[codes] * torch.exp2(scales.float() - _E8M0_BIAS).unsqueeze(-1)
    return values.flatten(-2).to(dtype).T


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Decode ``[..., rows, G, 16]`` blocks and ``[..., rows, G]`` scales into ``[..., G * 32, rows]``.

    For the published ``[experts, out, G, 16]`` tensors this is ``[experts, in, out]``, equal to
    ``convert_moe_packed_tensors``. Decoded one leading index (expert) at a time so the float32
    temporaries stay at one expert's size, not a whole layer's.
    """
    validate_mxfp4("blocks", blocks.shape, "scales", scales.shape, blocks.dtype, scales.dtype)
    *lead, rows, groups, _ = blocks.shape
    out = torch.empty(*lead, groups * MXFP4_BLOCK, rows, dtype=dtype, device=blocks.device)
    flat_out = out.view(-1, groups * MXFP4_BLOCK, rows)
    flat_blocks = blocks.reshape(-1, rows, groups, MXFP4_BLOCK // 2)
    flat_scales = scales.reshape(-1, rows, groups)
    for i in range(flat_out.shape[0]):
        flat_out[i] = _dequantize_one(flat_blocks[i], flat_scales[i], dtype)
    return out


def _round_to_e2m1(magnitude: torch.Tensor) -> torch.Tensor:
    """Codes 0-7 of the nearest E2M1 magnitude to ``magnitude`` (in [0, 6]), ties to even code."""
    mids = _MIDPOINTS.to(magnitude.device)
    code = torch.bucketize(magnitude.contiguous(), mids)  # a tie lands on the lower code
    tie = (code < len(mids)) & (magnitude == mids[code.clamp(max=len(mids) - 1)])
    return code + (tie & (code % 2 == 1)).long()


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode a ``[..., cols, rows]`` float weight (the layout ``dequantize_mxfp4`` returns) as MXFP4.

    Each block's exponent is the smallest that fits the block's largest magnitude within FP4's 6.0, so
    nothing is clipped and the error per element is at most half the E2M1 spacing at its magnitude
    times ``2 ** exponent``; weights already on the MXFP4 grid come back exactly. Used to build test
    checkpoints in the published layout, not for serving.
    """
    if weight.ndim < 2 or weight.shape[-2] % MXFP4_BLOCK:
        raise ValueError(
            f"quantize_mxfp4 needs [..., cols, rows] with cols divisible by {MXFP4_BLOCK}, "
            f"got {list(weight.shape)}"
        )
    if not torch.isfinite(weight).all():
        raise ValueError("quantize_mxfp4: weight has inf or nan values")
    w = weight.detach().float().transpose(-1, -2)  # [..., rows, cols]
    w = w.reshape(*w.shape[:-1], -1, MXFP4_BLOCK)  # [..., rows, G, 32]
    amax = w.abs().amax(dim=-1)
    # amax = m * 2**e with m in [0.5, 1): amax / 2**(e - 3) is in [4, 8), which fits 6.0 iff m <= 0.75.
    mantissa, exponent = torch.frexp(amax)
    shared = exponent - 3 + (mantissa > 0.75).int()
    shared = torch.where(amax > 0, shared, torch.zeros_like(shared)).clamp(-_E8M0_BIAS, _E8M0_BIAS)
    scaled = w * torch.exp2(-shared.float()).unsqueeze(-1)  # exact: a power-of-two scale
    code = _round_to_e2m1(scaled.abs().clamp(max=_FP4_MAX))
    code = code | ((scaled < 0) & (code > 0)).long() << 3  # no sign on zero: avoids -0.0
    pairs = code.to(torch.uint8).reshape(*code.shape[:-1], MXFP4_BLOCK // 2, 2)
    blocks = pairs[..., 0] | (pairs[..., 1] << 4)
    scales = (shared + _E8M0_BIAS).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def mxfp4_loader(experts: slice | None = None, dtype: torch.dtype = torch.bfloat16) -> WeightLoader:
    """Loader for a parameter stored as ``[blocks_key, scales_key]``: the decoded ``[E, in, out]`` weight.

    ``experts`` selects a range along dim 0 (expert parallelism) so only those experts' bytes are read;
    the rank arguments are ignored, since the caller picks the experts.
    """
    if experts is not None and experts.step not in (None, 1):
        raise ValueError(f"mxfp4_loader: experts must be a contiguous slice, got {experts}")

    def load(tensors: Sequence[CheckpointTensor], rank: int, world_size: int) -> torch.Tensor:
        if len(tensors) != 2:
            raise CheckpointError(
                f"MXFP4 weight expects [blocks, scales] keys, got {[t.key for t in tensors]}"
            )
        b, s = tensors
        validate_mxfp4(b.key, b.shape, s.key, s.shape)
        index = slice(None) if experts is None else experts
        if experts is not None and not range(b.shape[0])[experts]:
            raise CheckpointError(f"{b.describe()}: expert slice {experts} selects no experts")
        blocks, scales = b.read(index), s.read(index)
        validate_mxfp4(b.key, blocks.shape, s.key, scales.shape, blocks.dtype, scales.dtype)
        return dequantize_mxfp4(blocks, scales, dtype)

    return load
