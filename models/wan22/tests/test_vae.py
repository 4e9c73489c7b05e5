"""The Wan VAE against diffusers' AutoencoderKLWan: decode and encode (FP32 tight, BF16 three-way),
tiled against diffusers' tiled pass and against the untiled one, and patch parallel on 2 gloo ranks."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

from trnmodels.core.accuracy import assert_close_three_way
from trnmodels.core.errors import InputError, NonFiniteOutputError
from trnmodels.core.parallel.launch import run_on_ranks
from trnmodels.wan22.vae import CopyOnceCausalConv3d, SquareSumRMSNorm, Wan22VAE

HERE = Path(__file__).parent
TILES = dict(
    tile_sample_min_height=32,
    tile_sample_min_width=32,
    tile_sample_stride_height=24,
    tile_sample_stride_width=24,
)


@pytest.fixture(scope="module")
def vae_dir(tiny_t2v) -> Path:
    return tiny_t2v.path / "vae"


@pytest.fixture(scope="module")
def reference(vae_dir) -> AutoencoderKLWan:
    return AutoencoderKLWan.from_pretrained(vae_dir).eval()


@pytest.fixture(scope="module")
def reference_bf16(vae_dir) -> AutoencoderKLWan:
    return AutoencoderKLWan.from_pretrained(vae_dir, torch_dtype=torch.bfloat16).eval()


@pytest.fixture(scope="module")
def ours(vae_dir) -> Wan22VAE:
    return Wan22VAE.from_pretrained(vae_dir).eval()


@pytest.fixture(scope="module")
def latents() -> torch.Tensor:
    # 3 latent frames (9 video frames) of 6x8 latent pixels (48x64): first frame, then two cached steps.
    return torch.randn(1, 16, 3, 6, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def video() -> torch.Tensor:
    return torch.rand(1, 3, 9, 48, 64, generator=torch.Generator().manual_seed(1)) * 2 - 1


def decode(vae, z: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return vae.decode(z.to(vae.dtype)).sample


def encode(vae, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return vae.encode(x.to(vae.dtype)).latent_dist.parameters  # mean and logvar


def test_interface_matches_diffusers(ours, reference):
    assert isinstance(ours, AutoencoderKLWan)
    for field in ("z_dim", "latents_mean", "latents_std", "scale_factor_temporal", "scale_factor_spatial"):
        assert getattr(ours.config, field) == getattr(reference.config, field)
    assert ours.latent_size(9, 48, 64) == (3, 6, 8)


@pytest.mark.parametrize("cached_frames", [None, 1, 2])
@pytest.mark.parametrize(("kernel", "padding"), [(3, 1), ((3, 1, 1), (1, 0, 0)), (1, 0)])
def test_copy_once_causal_conv_matches_diffusers(kernel, padding, cached_frames):
    """Each causal convolution kind of the Wan VAE (3x3x3, the upsamplers' temporal 3x1x1, 1x1x1), with no
    cache, a short cache and a full one, against diffusers' ``WanCausalConv3d``; sizes on both sides of
    torch's switch between its native and its oneDNN convolution."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    torch.manual_seed(0)
    theirs = WanCausalConv3d(8, 4, kernel, padding=padding).eval()
    ours = WanCausalConv3d(8, 4, kernel, padding=padding).eval()
    ours.load_state_dict(theirs.state_dict())
    ours.__class__ = CopyOnceCausalConv3d
    for height in (6, 600):  # 1 * 8 * (3 + 2) * (height + 2) below and above torch's 20480
        x = torch.randn(1, 8, 3, height, 7)
        cache = None if cached_frames is None else torch.randn(1, 8, cached_frames, height, 7)
        with torch.no_grad():
            expected = theirs(x, cache)
            got = ours(x, cache)
        # The convolution gets the same tensor as diffusers' (one copy fewer on the way): the same sums.
        assert torch.equal(got, expected)


def test_our_vae_runs_copy_once_convolutions(ours, latents):
    decode(ours, latents[:, :, :1])
    kinds = {type(m) for m in ours.decoder.modules() if type(m).__name__.endswith("CausalConv3d")}
    assert kinds == {CopyOnceCausalConv3d}
    norms = {type(m) for m in ours.decoder.modules() if isinstance(m, WanRMS_norm)}
    assert norms == {SquareSumRMSNorm}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("channel_first", "images", "bias"), [(True, False, False), (True, True, True), (False, True, False)]
)
def test_square_sum_rms_norm_matches_diffusers(channel_first, images, bias, dtype):
    torch.manual_seed(0)
    theirs = WanRMS_norm(6, channel_first=channel_first, images=images, bias=bias).to(dtype)
    with torch.no_grad():
        theirs.gamma.normal_()
        if bias:
            theirs.bias.normal_()
    ours = copy.deepcopy(theirs)
    ours.__class__ = SquareSumRMSNorm
    shape = (2, 6, 3, 5, 4) if not images else (2, 6, 5, 4)
    x = torch.randn(shape if channel_first else (*shape[:1], *shape[2:], 6)).to(dtype)
    x[0, ..., 0] = 0  # a zero vector: both floor the norm
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert got.dtype == expected.dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    else:  # the same FP32 normalisation, then diffusers' BF16 scalings: one BF16 rounding apart at most
        torch.testing.assert_close(got.float(), expected.float(), rtol=2**-7, atol=2**-7)
    # With gradients, diffusers' own forward runs (the in-place scalings would break the backward).
    got = ours(x.float().requires_grad_()) if dtype == torch.float32 else None
    if got is not None:
        torch.testing.assert_close(got, expected)
        got.sum().backward()


def test_decode_fp32_matches_diffusers(ours, reference, latents):
    out = decode(ours, latents)
    assert out.shape == (1, 3, 9, 48, 64)
    torch.testing.assert_close(out, decode(reference, latents), rtol=1e-5, atol=1e-6)


def test_encode_fp32_matches_diffusers(ours, reference, video):
    torch.testing.assert_close(encode(ours, video), encode(reference, video), rtol=1e-5, atol=1e-6)


def test_decode_bf16_three_way(vae_dir, reference, reference_bf16, latents):
    ours_bf16 = Wan22VAE.from_pretrained(vae_dir, torch_dtype=torch.bfloat16).eval()
    assert_close_three_way(
        decode(ours_bf16, latents),
        decode(reference, latents),
        decode(reference_bf16, latents),
        name="vae decode bf16",
    )


def test_encode_bf16_three_way(vae_dir, reference, reference_bf16, video):
    ours_bf16 = Wan22VAE.from_pretrained(vae_dir, torch_dtype=torch.bfloat16).eval()
    assert_close_three_way(
        encode(ours_bf16, video),
        encode(reference, video),
        encode(reference_bf16, video),
        name="vae encode bf16",
    )


@pytest.fixture(scope="module")
def tiled(vae_dir, reference):
    ours_tiled = Wan22VAE.from_pretrained(vae_dir).eval()
    ours_tiled.enable_tiling(**TILES)
    ref_tiled = AutoencoderKLWan.from_pretrained(vae_dir).eval()
    ref_tiled.enable_tiling(**TILES)
    return ours_tiled, ref_tiled


def test_tiled_decode_matches_diffusers_tiled(tiled, latents):
    ours_tiled, ref_tiled = tiled
    assert len(ours_tiled.decode_tile_grid((6, 8)).tiles()) == 6  # 2 rows x 3 columns of 4x4 latents
    torch.testing.assert_close(decode(ours_tiled, latents), decode(ref_tiled, latents), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # test_tiled_decode_matches_diffusers_tiled is the fast tiling case
def test_tiled_encode_matches_diffusers_tiled(tiled, video):
    ours_tiled, ref_tiled = tiled
    torch.testing.assert_close(encode(ours_tiled, video), encode(ref_tiled, video), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_tiled_decode_close_to_untiled(tiled, ours, latents):
    # Tiles do not see past their window (and the middle block attends over the whole frame), so a tiled
    # decode is an approximation; the overlap keeps it close to the untiled one.
    full, tiles = decode(ours, latents), decode(tiled[0], latents)
    assert not torch.equal(full, tiles)
    err = (full - tiles).abs()
    scale = full.abs().mean()
    assert err.mean() < 0.25 * scale, f"tiled vs untiled mean |err| {err.mean():.3g} vs mean |x| {scale:.3g}"


def test_bad_inputs_are_named(ours, video):
    with pytest.raises(InputError, match="frame count of the form 4k\\+1"):
        ours.encode(video[:, :, :6])
    with pytest.raises(InputError, match="divisible by the spatial compression ratio 8"):
        ours.encode(video[:, :, :, :44])
    with pytest.raises(InputError, match="expected latents \\[B, 16, T, h, w\\]"):
        ours.decode(torch.zeros(1, 4, 2, 6, 8))


@pytest.mark.slow  # two gloo ranks
def test_patch_parallel_two_ranks_equals_tiled(vae_dir, tiled, latents):
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HERE))
    try:
        fns = importlib.import_module("_wan22_vae_rank_fns")
        per_rank = run_on_ranks(fns.patch_parallel_decode, 2, str(vae_dir), latents)
    finally:
        mp.undo()
    expected = decode(tiled[0], latents)
    # Not bitwise: the ranks are other processes running another thread count, so oneDNN may sum a conv's
    # products in another order, and FP32 rounds each order differently (seen: 1 ulp, 1.2e-7, on a third
    # of the elements of this O(1) output). A few ulps of the output's magnitude (8 x eps x max|x|, about
    # 1e-6 here) admit that and nothing else: a misplaced or missing tile is off by O(0.1) or more.
    atol = 8 * torch.finfo(torch.float32).eps * max(1.0, expected.abs().max().item())
    for sample in per_rank:
        torch.testing.assert_close(sample, expected, rtol=0, atol=atol)


@pytest.mark.slow  # AOT compiles
def test_compiled_decode_matches_eager_and_hits_cache(vae_dir, ours, latents, tmp_path):
    # Two graphs (first frame, then a fixed-shape cached step replayed for frames 2 and 3), compiled once.
    vae = Wan22VAE.from_pretrained(vae_dir).eval()
    results = vae.compile(num_frames=9, height=48, width=64, cache_dir=tmp_path)
    assert [(r.name, r.cache) for r in results] == [
        ("wan22_vae_decoder/first", "miss"),
        ("wan22_vae_decoder/step", "miss"),
    ]
    assert vae.compiled_graphs == 2
    torch.testing.assert_close(decode(vae, latents), decode(ours, latents), rtol=1e-5, atol=1e-5)
    again = (
        Wan22VAE.from_pretrained(vae_dir)
        .eval()
        .compile(num_frames=9, height=48, width=64, cache_dir=tmp_path)
    )
    assert [r.cache for r in again] == ["hit", "hit"]


def test_non_finite_latents_are_refused_and_a_nan_weight_is_named(ours, latents, video):
    bad = latents.clone()
    bad[0, 3, 1, 2, 2] = float("nan")
    with pytest.raises(InputError, match=r"VAE decode: latents: NaN or inf in 1 of \d+ values"):
        decode(ours, bad)
    broken = copy.deepcopy(ours)
    name = "decoder.conv_out.weight"
    with torch.no_grad():
        broken.get_parameter(name).view(-1)[0] = float("inf")
    with pytest.raises(NonFiniteOutputError, match=rf"VAE decode: frames: NaN or inf .*parameter {name}"):
        decode(broken, latents)
    name = "encoder.conv_out.weight"
    with torch.no_grad():
        broken.get_parameter(name).view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteOutputError, match=rf"VAE encode: latent moments: NaN or inf .*{name}"):
        encode(broken, video)
