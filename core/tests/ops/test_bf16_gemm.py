"""``cpu.bf16_gemm``: core's BF16 GEMM against a float64 truth, element by element within BF16 rounding
(half a unit in the last place of the result: 2**-8 of it) plus FP32 sums' slack, at every row count
the kernel splits differently (rows share a weight load in blocks of 8 with AVX512-BF16, of 2 with AVX2,
so a last block of 1 to 7) and at edges (a last panel of fewer than 32 columns, an odd K); non-finite
inputs reach the result; the op traces. Each build this CPU can run is tested (the other in a process
of its own)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from trnmodels.core.cpu import bf16_gemm, extension
from trnmodels.core.errors import ConfigError
from trnmodels.core.testing.markers import needs_cpu_extension
from trnmodels.core.vllm.packed_linear import GEMM_ENV_VAR, chosen_gemm, pack_linear_layers

pytestmark = needs_cpu_extension("core's BF16 GEMM")


def assert_within_bf16_rounding(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    truth = x.double() @ weight.double().T
    # Rounding to BF16 (8 significant bits) moves a value by at most half a unit in its last place, 2**-8 of
    # it; FP32 sums add at most K * 2**-24 of sum |x w|.
    slack = weight.shape[1] * 2**-24 * (x.double().abs() @ weight.double().abs().T)
    bound = 2**-8 * truth.abs() + slack
    assert got.dtype == torch.bfloat16 and got.shape == truth.shape
    excess = (got.double() - truth).abs() - bound
    assert excess.max() <= 0, (
        f"{int((excess > 0).sum())} elements beyond BF16 rounding, worst by {excess.max():.3g}"
    )


@pytest.mark.parametrize("n, k", [(96, 64), (100, 77), (33, 256), (1, 5), (40, 1)])
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 19])
def test_matches_a_float64_truth_within_bf16_rounding(n, k, rows):
    gen = torch.Generator().manual_seed(n * 1000 + k * 10 + rows)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    x = torch.randn(rows, k, generator=gen).bfloat16()
    assert_within_bf16_rounding(bf16_gemm.gemm(x, bf16_gemm.pack(weight), n), x, weight)


def test_leading_dimensions_and_a_strided_input():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 48, generator=gen).bfloat16()
    x = torch.randn(2, 3, 96, generator=gen).bfloat16()[..., ::2]  # not contiguous
    got = bf16_gemm.gemm(x, bf16_gemm.pack(weight), 64)
    assert got.shape == (2, 3, 64)
    assert_within_bf16_rounding(got.reshape(6, 64), x.reshape(6, 48), weight)
    assert bf16_gemm.gemm(x[:0], bf16_gemm.pack(weight), 64).shape == (0, 3, 64)


def test_the_pack_is_zero_padded_panels_of_32_columns():
    weight = torch.arange(1, 35 * 3 + 1, dtype=torch.float32).reshape(35, 3).bfloat16()
    packed = bf16_gemm.pack(weight)
    assert packed.shape == (2, 2, 32, 2)
    # packed[p][k // 2][c][k % 2] == weight[32 p + c][k], zero past the weight's edges.
    assert torch.equal(packed[0, 0, 5], weight[5, 0:2])
    assert torch.equal(packed[1, 1, 2], torch.stack([weight[34, 2], torch.tensor(0).bfloat16()]))
    assert packed[1, :, 3:].abs().sum() == 0


def test_non_finite_inputs_are_not_hidden():
    weight = torch.ones(40, 6).bfloat16()
    weight[33, 4] = float("nan")
    x = torch.ones(2, 6).bfloat16()
    x[1, 0] = float("inf")
    got = bf16_gemm.gemm(x, bf16_gemm.pack(weight), 40)
    assert got[:, 33].isnan().all() and got[1, 0].isinf()
    assert torch.equal(got[0, :33].float(), torch.full((33,), 6.0))


def test_a_mismatched_input_is_refused():
    packed = bf16_gemm.pack(torch.ones(40, 6).bfloat16())
    with pytest.raises(RuntimeError, match="x has 8 columns, the packed weight 6"):
        bf16_gemm.gemm(torch.ones(1, 8).bfloat16(), packed, 40)
    with pytest.raises(RuntimeError, match="x must be a CPU bfloat16 tensor"):
        bf16_gemm.gemm(torch.ones(1, 6), packed, 40)
    with pytest.raises(RuntimeError, match="n = 80 does not fit 2 panels"):
        bf16_gemm.gemm(torch.ones(1, 6).bfloat16(), packed, 80)


def test_torch_compile_traces_the_op():
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(70, 64, generator=gen).bfloat16()
    packed = bf16_gemm.pack(weight)
    compiled = torch.compile(lambda x: bf16_gemm.gemm(x, packed, 70) * 2, dynamic=True, fullgraph=True)
    for rows in (3, 11):
        x = torch.randn(rows, 64, generator=gen).bfloat16()
        assert torch.equal(compiled(x), bf16_gemm.gemm(x, packed, 70) * 2)


def test_the_bridge_chooses_core_s_gemm_unless_told_and_refuses_a_bad_setting(monkeypatch):
    monkeypatch.delenv(GEMM_ENV_VAR, raising=False)
    assert chosen_gemm() == "core"
    monkeypatch.setenv(GEMM_ENV_VAR, "vllm")
    assert chosen_gemm() == "vllm"
    monkeypatch.setenv(GEMM_ENV_VAR, "onednn")
    with pytest.raises(ConfigError, match=r"TRNMODELS_BF16_GEMM: expected one of core, vllm, got 'onednn'"):
        chosen_gemm()
    with pytest.raises(ConfigError, match="TRNMODELS_BF16_GEMM"):  # even with no BF16 weight to pack
        pack_linear_layers(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_a_lock_file_left_by_a_killed_build_does_not_block_the_next(tmp_path):
    """torch's extension builder waits forever on a ``lock`` file its killed predecessor left behind."""
    folder = extension.build_dir(extension.isa())
    cache = tmp_path / "cache"
    copy = cache / folder.relative_to(folder.parents[3])
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.lock", "lock"))
    (copy / "lock").touch()
    probe = "from trnmodels.core.cpu import extension; print(extension.why_unavailable())"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-2000:]
    assert not (copy / "lock").exists()


def test_a_bad_isa_setting_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(extension.ISA_ENV_VAR, "avx-2")
    with pytest.raises(
        ConfigError, match=r"TRNMODELS_BF16_GEMM_ISA: expected one of avx512_bf16, avx2, got 'avx-2'"
    ):
        extension.why_unavailable()
    missing = [name for name in extension.ISA_FLAGS if not extension._cpu_has(name)]
    if missing:
        monkeypatch.setenv(extension.ISA_ENV_VAR, missing[0])
        with pytest.raises(ConfigError, match=f"TRNMODELS_BF16_GEMM_ISA={missing[0]}: this CPU has no "):
            extension.why_unavailable()


@pytest.mark.parametrize("isa", list(extension.ISA_FLAGS))
def test_every_build_this_cpu_can_run_matches_the_truth(isa):
    """The build this process loaded is the tests above; each other build this CPU can run (the AVX2 one
    on a CPU with AVX512-BF16) runs them in a process of its own."""
    if isa == extension.isa():
        pytest.skip(f"the {isa} build is this process's, tested above")
    if not extension._cpu_has(isa):
        pytest.skip(f"this CPU cannot run the {isa} build")
    env = {**os.environ, extension.ISA_ENV_VAR: isa}
    tests = "float64_truth or leading_dimensions or non_finite or torch_compile"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", tests]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
