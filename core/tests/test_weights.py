"""Weight loading: safetensors checkpoints (single and sharded), per-rank loaders, strict key coverage."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from trnmodels.core.errors import CheckpointError
from trnmodels.core.parallel import ColumnParallelLinear, ProcessGroupHandle, RowParallelLinear
from trnmodels.core.weights import (
    CheckpointTensor,
    SafetensorsCheckpoint,
    StateDictCheckpoint,
    check_key_coverage,
    concat_sharded,
    fused_qkv,
    identity_keys,
    kv_head_for_rank,
    load_parameters,
    padded_rows,
    replicated,
    set_weight_loader,
    sharded,
    with_rank_override,
)

HEADS, KV, HEAD_DIM, HIDDEN = 8, 2, 4, 3


def _tensors() -> dict[str, torch.Tensor]:
    def ar(*shape: int) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        return torch.arange(float(n)).reshape(shape)

    return {
        "w": ar(8, 6),
        "q.weight": ar(HEADS * HEAD_DIM, HIDDEN),
        "k.weight": ar(KV * HEAD_DIM, HIDDEN) + 1000,
        "v.weight": ar(KV * HEAD_DIM, HIDDEN) + 2000,
        "q.bias": ar(HEADS * HEAD_DIM) + 3000,
        "k.bias": ar(KV * HEAD_DIM) + 4000,
        "v.bias": ar(KV * HEAD_DIM) + 5000,
        "embed": ar(5, 3) + 1,
        "gate": ar(6, 4),
        "up": ar(6, 4) + 100,
    }


@pytest.fixture
def single_dir(tmp_path: Path) -> Path:
    save_file(_tensors(), str(tmp_path / "model.safetensors"))
    return tmp_path


SHARDS = {
    "model-00001-of-00002.safetensors": ["w", "q.weight", "k.weight", "v.weight", "embed"],
    "model-00002-of-00002.safetensors": ["q.bias", "k.bias", "v.bias", "gate", "up"],
}


def _write_sharded(d: Path, weight_map: dict[str, str] | None = None) -> Path:
    t = _tensors()
    for file, keys in SHARDS.items():
        save_file({k: t[k] for k in keys}, str(d / file))
    if weight_map is None:
        weight_map = {k: f for f, keys in SHARDS.items() for k in keys}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


@pytest.fixture
def sharded_dir(tmp_path: Path) -> Path:
    return _write_sharded(tmp_path)


@pytest.fixture(params=["single", "sharded"])
def ckpt(request, tmp_path: Path) -> SafetensorsCheckpoint:
    if request.param == "single":
        save_file(_tensors(), str(tmp_path / "model.safetensors"))
    else:
        _write_sharded(tmp_path)
    return SafetensorsCheckpoint(tmp_path)


# --- checkpoint access -------------------------------------------------------------------------------


def test_keys_single_and_sharded(single_dir: Path, sharded_dir: Path):
    assert sorted(SafetensorsCheckpoint(single_dir).keys()) == sorted(_tensors())
    sharded_ckpt = SafetensorsCheckpoint(sharded_dir)
    assert sorted(sharded_ckpt.keys()) == sorted(_tensors())
    assert Path(sharded_ckpt.tensor("gate").file).name == "model-00002-of-00002.safetensors"
    assert sharded_ckpt.tensor("q.weight").shape == (HEADS * HEAD_DIM, HIDDEN)


def test_read_whole_tensor(ckpt: SafetensorsCheckpoint):
    for key, value in _tensors().items():
        torch.testing.assert_close(ckpt.tensor(key).read(), value)
        torch.testing.assert_close(replicated([ckpt.tensor(key)], 1, 2), value)


# --- loaders -----------------------------------------------------------------------------------------


def test_sharded_rows_and_columns(ckpt: SafetensorsCheckpoint):
    w = _tensors()["w"]  # [8, 6]
    t = ckpt.tensor("w")
    for rank in range(4):
        torch.testing.assert_close(sharded(0)([t], rank, 4), w[2 * rank : 2 * rank + 2, :])
    for rank in range(2):
        torch.testing.assert_close(sharded(1)([t], rank, 2), w[:, 3 * rank : 3 * rank + 3])
    torch.testing.assert_close(sharded(1)([t], 2, 3), w[:, 4:6])


def test_sharded_indivisible_names_key(ckpt: SafetensorsCheckpoint):
    with pytest.raises(CheckpointError, match=r"w \[8, 6\].*dim 1 of size 6 does not divide by 4"):
        sharded(1)([ckpt.tensor("w")], 0, 4)


def test_fused_qkv_weights_split_kv_world2(ckpt: SafetensorsCheckpoint):
    t = _tensors()
    q, k, v = t["q.weight"], t["k.weight"], t["v.weight"]
    loader = fused_qkv(HEADS, KV, HEAD_DIM)
    tensors = [ckpt.tensor(n) for n in ("q.weight", "k.weight", "v.weight")]
    # World 2 = KV heads: each rank gets 4 query heads (16 rows) and its own KV head (4 rows).
    torch.testing.assert_close(loader(tensors, 0, 2), torch.cat([q[0:16], k[0:4], v[0:4]]))
    torch.testing.assert_close(loader(tensors, 1, 2), torch.cat([q[16:32], k[4:8], v[4:8]]))


def test_fused_qkv_weights_replicated_kv_world4(ckpt: SafetensorsCheckpoint):
    t = _tensors()
    q, k, v = t["q.weight"], t["k.weight"], t["v.weight"]
    loader = fused_qkv(HEADS, KV, HEAD_DIM)
    tensors = [ckpt.tensor(n) for n in ("q.weight", "k.weight", "v.weight")]
    # World 4 > 2 KV heads: ranks {0, 1} share KV head 0, ranks {2, 3} share KV head 1.
    expected = {
        0: torch.cat([q[0:8], k[0:4], v[0:4]]),
        1: torch.cat([q[8:16], k[0:4], v[0:4]]),
        2: torch.cat([q[16:24], k[4:8], v[4:8]]),
        3: torch.cat([q[24:32], k[4:8], v[4:8]]),
    }
    for rank, want in expected.items():
        torch.testing.assert_close(loader(tensors, rank, 4), want)
    assert [kv_head_for_rank(r, 4, 2) for r in range(4)] == [0, 0, 1, 1]


def test_fused_qkv_biases(ckpt: SafetensorsCheckpoint):
    t = _tensors()
    qb, kb, vb = t["q.bias"], t["k.bias"], t["v.bias"]
    loader = fused_qkv(HEADS, KV, HEAD_DIM)
    tensors = [ckpt.tensor(n) for n in ("q.bias", "k.bias", "v.bias")]
    torch.testing.assert_close(loader(tensors, 1, 2), torch.cat([qb[16:32], kb[4:8], vb[4:8]]))
    torch.testing.assert_close(loader(tensors, 1, 4), torch.cat([qb[8:16], kb[0:4], vb[0:4]]))
    torch.testing.assert_close(loader(tensors, 2, 4), torch.cat([qb[16:24], kb[4:8], vb[4:8]]))
    torch.testing.assert_close(loader(tensors, 0, 1), torch.cat([qb, kb, vb]))


def test_fused_qkv_errors(ckpt: SafetensorsCheckpoint):
    q, k = ckpt.tensor("q.weight"), ckpt.tensor("k.weight")
    with pytest.raises(CheckpointError, match=r"q, k and v.*'q.weight', 'k.weight'"):
        fused_qkv(HEADS, KV, HEAD_DIM)([q, k], 0, 2)
    # Claiming 4 KV heads: k has 8 rows, not 16.
    with pytest.raises(CheckpointError, match=r"k.weight \[8, 3\].*4 heads × head_dim 4 = 16 rows"):
        fused_qkv(HEADS, 4, HEAD_DIM)([q, k, ckpt.tensor("v.weight")], 0, 2)


def test_fused_qk_without_v_holds_q_and_k_rows_only(ckpt: SafetensorsCheckpoint):
    t = _tensors()
    q, k = t["q.weight"], t["k.weight"]
    loader = fused_qkv(HEADS, KV, HEAD_DIM, with_v=False)
    tensors = [ckpt.tensor(n) for n in ("q.weight", "k.weight")]
    torch.testing.assert_close(loader(tensors, 0, 1), torch.cat([q, k]))
    torch.testing.assert_close(loader(tensors, 1, 2), torch.cat([q[16:32], k[4:8]]))
    # World 4 > 2 KV heads: rank 2 holds query heads 4-5 (rows 16-24) and KV head 1, as with v.
    torch.testing.assert_close(loader(tensors, 2, 4), torch.cat([q[16:24], k[4:8]]))
    with pytest.raises(CheckpointError, match=r"q and k keys, got \['q.weight', 'k.weight', 'v.weight'\]"):
        loader([*tensors, ckpt.tensor("v.weight")], 0, 1)


def test_padded_rows_beyond_vocab_are_zero(ckpt: SafetensorsCheckpoint):
    embed = _tensors()["embed"]  # vocab 5, dim 3; at world 4 each rank holds 2 rows (8 padded)
    t = ckpt.tensor("embed")
    loader = padded_rows(2)
    torch.testing.assert_close(loader([t], 0, 4), embed[0:2])
    torch.testing.assert_close(loader([t], 1, 4), embed[2:4])
    torch.testing.assert_close(loader([t], 2, 4), torch.cat([embed[4:5], torch.zeros(1, 3)]))
    torch.testing.assert_close(loader([t], 3, 4), torch.zeros(2, 3))  # entirely past the vocab
    # World 2: 3 rows each (6 padded), the last row of rank 1 is padding.
    torch.testing.assert_close(padded_rows(3)([t], 1, 2), torch.cat([embed[3:5], torch.zeros(1, 3)]))


def test_concat_sharded(ckpt: SafetensorsCheckpoint):
    gate, up = _tensors()["gate"], _tensors()["up"]  # [6, 4] each
    tensors = [ckpt.tensor("gate"), ckpt.tensor("up")]
    torch.testing.assert_close(concat_sharded(0)(tensors, 0, 2), torch.cat([gate[0:3], up[0:3]]))
    torch.testing.assert_close(concat_sharded(0)(tensors, 1, 2), torch.cat([gate[3:6], up[3:6]]))
    torch.testing.assert_close(concat_sharded(1)(tensors, 1, 2), torch.cat([gate[:, 2:4], up[:, 2:4]], 1))
    torch.testing.assert_close(concat_sharded(0)(tensors, 0, 1), torch.cat([gate, up]))


def test_with_rank_override(ckpt: SafetensorsCheckpoint):
    w = _tensors()["w"]
    loader = with_rank_override(sharded(0), 3, 4)
    # Whatever rank/world the caller passes, the loader reads rank 3 of 4.
    torch.testing.assert_close(loader([ckpt.tensor("w")], 0, 1), w[6:8])
    torch.testing.assert_close(loader([ckpt.tensor("w")], 1, 2), w[6:8])


def test_with_rank_override_of_a_later_dim_split_reads_the_rank_part(ckpt: SafetensorsCheckpoint):
    w = _tensors()["w"]
    loader = with_rank_override(sharded(1), 1, 2)
    half = w.shape[1] // 2
    # The override's part, not the whole tensor its one-rank row plan would give.
    torch.testing.assert_close(loader([ckpt.tensor("w")], 0, 1), w[:, half:])
    assert loader.row_plan([ckpt.tensor("w")], 0, 1) is None
    alone = with_rank_override(sharded(1), 0, 1)
    [(tensor, start, stop)] = alone.row_plan([ckpt.tensor("w")], 0, 2)
    assert (tensor.key, start, stop) == ("w", 0, w.shape[0])


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_later_dim_split_alone_is_read_straight_into_the_parameter(ckpt, monkeypatch, world_size):
    """A row-parallel weight (split along dim 1) at one rank is whole rows: read into the parameter with
    no temporary. Split over two ranks it is read in column chunks, as before."""
    from trnmodels.core.weights.safetensors_file import TensorSlice

    w = _tensors()["w"]
    reads = []
    rows = TensorSlice._rows
    monkeypatch.setattr(TensorSlice, "_rows", lambda self, *a: reads.append(a) or rows(self, *a))
    model = nn.Module()
    model.w = nn.Parameter(
        torch.full((w.shape[0], w.shape[1] // world_size), float("nan")), requires_grad=False
    )
    set_weight_loader(model.w, sharded(1))
    load_parameters(
        model, ckpt, {"w": "w"}, rank=world_size - 1, world_size=world_size, ignore=["*"], progress=False
    )
    assert torch.equal(
        model.w.data, w[:, (world_size - 1) * w.shape[1] // world_size :][:, : w.shape[1] // world_size]
    )
    assert bool(reads) == (world_size > 1)


def test_single_key_loader_rejects_several_keys(ckpt: SafetensorsCheckpoint):
    with pytest.raises(CheckpointError, match=r"one checkpoint key.*'gate', 'up'"):
        sharded(0)([ckpt.tensor("gate"), ckpt.tensor("up")], 0, 2)


# --- lazy reading ------------------------------------------------------------------------------------


class _Recording:
    """A tensor source that records every index it is asked for."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.requests: list[Any] = []

    def get_shape(self) -> list[int]:
        return list(self.inner.get_shape())

    def __getitem__(self, index: Any) -> torch.Tensor:
        self.requests.append(index)
        return self.inner[index]


def _recording(t: CheckpointTensor) -> tuple[CheckpointTensor, _Recording]:
    rec = _Recording(t.source)
    return dataclasses.replace(t, source=rec), rec


def test_loaders_read_only_their_slice(ckpt: SafetensorsCheckpoint):
    w, rec = _recording(ckpt.tensor("w"))
    value = sharded(0)([w], 1, 4)
    assert rec.requests == [slice(2, 4)]
    torch.testing.assert_close(value, _tensors()["w"][2:4])

    w, rec = _recording(ckpt.tensor("w"))
    sharded(1)([w], 1, 2)
    assert rec.requests == [(slice(None), slice(3, 6))]

    tensors, recs = zip(
        *(_recording(ckpt.tensor(n)) for n in ("q.weight", "k.weight", "v.weight")), strict=True
    )
    fused_qkv(HEADS, KV, HEAD_DIM)(list(tensors), 3, 4)
    assert recs[0].requests == [slice(24, 32)]
    assert recs[1].requests == [slice(4, 8)] and recs[2].requests == [slice(4, 8)]

    e, rec = _recording(ckpt.tensor("embed"))
    padded_rows(2)([e], 2, 4)
    assert rec.requests == [slice(4, 5)]


def test_load_parameters_reads_only_rank_slices():
    src = torch.arange(24.0).reshape(4, 6)
    ckpt = StateDictCheckpoint({"w": src})
    rec = _Recording(ckpt.tensor("w").source)

    class _Ckpt:
        def keys(self):
            return ckpt.keys()

        def tensor(self, key):
            return dataclasses.replace(ckpt.tensor(key), source=rec)

    lin = ColumnParallelLinear(6, 4, tp=ProcessGroupHandle("tp", 2, 1))
    load_parameters(lin, _Ckpt(), {"weight": "w"}, rank=1, world_size=2, progress=False)
    assert rec.requests == [slice(2, 4)]
    torch.testing.assert_close(lin.weight.data, src[2:4])


# --- load_parameters ---------------------------------------------------------------------------------


class _Tiny(nn.Module):
    def __init__(self, dtype: torch.dtype = torch.bfloat16, tp: ProcessGroupHandle | None = None):
        super().__init__()
        self.proj = ColumnParallelLinear(6, 8, bias=True, dtype=dtype, tp=tp)
        self.out = RowParallelLinear(8, 4, dtype=dtype, tp=tp)
        self.scale = nn.Parameter(torch.empty(6, dtype=dtype), requires_grad=False)
        self.custom = nn.Parameter(torch.empty(2, 6, dtype=dtype), requires_grad=False)
        set_weight_loader(self.custom, lambda ts, rank, world: ts[0].read(slice(0, 2)) * 2)


def _tiny_state(extra: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    sd = {
        "model.proj.weight": torch.randn(8, 6),
        "model.proj.bias": torch.randn(8),
        "model.out.weight": torch.randn(4, 8),
        "model.norm": torch.randn(6),
        "model.table": torch.randn(5, 6),
    }
    sd.update(extra or {})
    return sd


TINY_MAP = {
    "proj.weight": "model.proj.weight",
    "proj.bias": "model.proj.bias",
    "out.weight": "model.out.weight",
    "scale": "model.norm",
    "custom": "model.table",
}


@pytest.mark.parametrize("from_files", [False, True])
def test_load_parameters_converts_dtype(tmp_path: Path, from_files: bool):
    sd = _tiny_state()
    if from_files:
        save_file(sd, str(tmp_path / "model.safetensors"))
        ckpt = SafetensorsCheckpoint(tmp_path)
    else:
        ckpt = StateDictCheckpoint(sd)
    model = _Tiny()
    load_parameters(model, ckpt, TINY_MAP, progress=False)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    torch.testing.assert_close(model.proj.weight.data, sd["model.proj.weight"].to(torch.bfloat16))
    torch.testing.assert_close(model.proj.bias.data, sd["model.proj.bias"].to(torch.bfloat16))
    torch.testing.assert_close(model.out.weight.data, sd["model.out.weight"].to(torch.bfloat16))
    torch.testing.assert_close(model.scale.data, sd["model.norm"].to(torch.bfloat16))
    torch.testing.assert_close(model.custom.data, (sd["model.table"][:2] * 2).to(torch.bfloat16))


@pytest.mark.parametrize("key, stored", [("model.proj.weight", torch.int8), ("model.norm", torch.bool)])
def test_integer_or_bool_tensor_for_a_float_parameter_is_refused(
    tmp_path: Path, key: str, stored: torch.dtype
):
    """Issue 17: an int8 tensor where a float weight belongs was cast silently into a wrong model."""
    sd = _tiny_state()
    sd[key] = sd[key].to(stored)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"{key} .*stores {stored}.*expects torch.bfloat16"):
        load_parameters(_Tiny(), SafetensorsCheckpoint(tmp_path), TINY_MAP, progress=False)


def test_an_integer_key_fused_with_float_keys_is_refused():
    """torch.cat would promote the int8 half of a fused weight to float without a word."""
    sd = {"gate": torch.randn(6, 4), "up": torch.randn(6, 4).to(torch.int8)}
    model = nn.Module()
    model.gate_up = nn.Parameter(torch.empty(12, 4), requires_grad=False)
    set_weight_loader(model.gate_up, concat_sharded(0))
    with pytest.raises(CheckpointError, match=r"up \[6, 4\].*stores torch.int8 but parameter gate_up"):
        load_parameters(model, StateDictCheckpoint(sd), {"gate_up": ["gate", "up"]}, progress=False)


def test_a_dequantizing_loader_may_read_integer_storage():
    """Packed integers are fine when the parameter's loader turns them into floats (the MXFP4 path)."""
    sd = _tiny_state({"model.table": torch.arange(30, dtype=torch.uint8).reshape(5, 6)})
    model = _Tiny()
    set_weight_loader(model.custom, lambda ts, rank, world: ts[0].read(slice(0, 2)).float() / 2)
    load_parameters(model, StateDictCheckpoint(sd), TINY_MAP, progress=False)
    assert model.custom[1, 0].item() == 3.0


def test_load_parameters_rank_local(tmp_path: Path):
    sd = _tiny_state()
    model = _Tiny(dtype=torch.float32, tp=ProcessGroupHandle("tp", 2, 1))
    load_parameters(model, StateDictCheckpoint(sd), TINY_MAP, rank=1, world_size=2, progress=False)
    torch.testing.assert_close(model.proj.weight.data, sd["model.proj.weight"][4:8])
    torch.testing.assert_close(model.proj.bias.data, sd["model.proj.bias"][4:8])
    torch.testing.assert_close(model.out.weight.data, sd["model.out.weight"][:, 4:8])
    torch.testing.assert_close(model.scale.data, sd["model.norm"])  # replicated by default


def test_missing_keys_named_and_nothing_loaded():
    sd = _tiny_state()
    del sd["model.norm"], sd["model.table"]
    model = _Tiny()
    with torch.no_grad():
        model.proj.weight.fill_(7.0)
    with pytest.raises(CheckpointError, match=r"missing keys: model\.norm, model\.table") as e:
        load_parameters(model, StateDictCheckpoint(sd), TINY_MAP, progress=False)
    assert "unexpected" not in str(e.value)
    # Coverage is checked before any weight is read.
    assert torch.all(model.proj.weight == 7.0)


def test_unexpected_keys_named_and_ignore_glob():
    extra = {"model.rotary.inv_freq": torch.zeros(2), "lm_head.weight": torch.zeros(3, 3)}
    ckpt = StateDictCheckpoint(_tiny_state(extra))
    with pytest.raises(CheckpointError, match=r"unexpected keys: lm_head\.weight, model\.rotary\.inv_freq"):
        load_parameters(_Tiny(), ckpt, TINY_MAP, progress=False)
    with pytest.raises(CheckpointError, match=r"unexpected keys: lm_head\.weight$") as e:
        load_parameters(_Tiny(), ckpt, TINY_MAP, ignore=["*.inv_freq"], progress=False)
    assert "inv_freq" not in str(e.value)
    load_parameters(_Tiny(), ckpt, TINY_MAP, ignore=["*.inv_freq", "lm_head.*"], progress=False)


def test_missing_and_unexpected_reported_together(sharded_dir: Path):
    ckpt = SafetensorsCheckpoint(sharded_dir)
    with pytest.raises(CheckpointError) as e:
        check_key_coverage(ckpt, ["a", "b"], {"a": "w", "b": ["gate", "nope"]}, ignore=["q.*", "k.*", "v.*"])
    msg = str(e.value)
    assert str(sharded_dir) in msg
    assert "missing keys: nope" in msg
    assert "unexpected keys: embed, up" in msg


def test_mapping_must_match_parameters():
    ckpt = StateDictCheckpoint(_tiny_state())
    mapping = {k: v for k, v in TINY_MAP.items() if k != "scale"} | {"bogus": "model.norm"}
    with pytest.raises(CheckpointError, match=r"no checkpoint key: scale.*not parameters: bogus"):
        load_parameters(_Tiny(), ckpt, mapping, progress=False)


def test_wrong_shape_names_key_and_shapes():
    sd = _tiny_state({"model.proj.weight": torch.zeros(8, 5)})
    with pytest.raises(CheckpointError) as e:
        load_parameters(_Tiny(), StateDictCheckpoint(sd), TINY_MAP, progress=False)
    msg = str(e.value)
    assert "model.proj.weight [8, 5]" in msg  # the key and its checkpoint shape
    assert "proj.weight expects shape [8, 6]" in msg  # the parameter's expected shape
    assert "gives [8, 5]" in msg


def test_truncated_file_names_file(tmp_path: Path):
    save_file(_tensors(), str(tmp_path / "model.safetensors"))
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or damaged") as e:
        SafetensorsCheckpoint(tmp_path)
    assert str(path) in str(e.value)


def test_truncated_shard_names_file(sharded_dir: Path):
    path = sharded_dir / "model-00002-of-00002.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or damaged") as e:
        SafetensorsCheckpoint(sharded_dir)
    assert str(path) in str(e.value)


def test_index_missing_shard_file(sharded_dir: Path):
    (sharded_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"not present: model-00002-of-00002\.safetensors"):
        SafetensorsCheckpoint(sharded_dir)


def test_index_lists_key_its_file_lacks(tmp_path: Path):
    weight_map = {k: f for f, keys in SHARDS.items() for k in keys}
    weight_map["gate"] = "model-00001-of-00002.safetensors"  # gate really lives in shard 2
    _write_sharded(tmp_path, weight_map)
    with pytest.raises(
        CheckpointError, match=r"model-00001-of-00002\.safetensors: index lists keys the file lacks: gate"
    ):
        SafetensorsCheckpoint(tmp_path)


def test_malformed_index(tmp_path: Path):
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match=r"index\.json: not a safetensors index with a 'weight_map'"):
        SafetensorsCheckpoint(tmp_path)


def test_directory_without_checkpoint(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(
        CheckpointError, match=r"no model\.safetensors or model\.safetensors\.index\.json"
    ) as e:
        SafetensorsCheckpoint(tmp_path)
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize("weight_map", [[], None, {"w": 1}], ids=["list", "null", "int-file"])
def test_index_with_malformed_weight_map(tmp_path: Path, weight_map: object):
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model-00001-of-00001.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(CheckpointError) as e:
        SafetensorsCheckpoint(tmp_path)
    assert str(index) in str(e.value)


def test_identity_keys_maps_fused_projections_to_their_sources():
    layer = torch.nn.Module()
    layer.input_layernorm = torch.nn.LayerNorm(4)
    layer.self_attn = torch.nn.Module()
    layer.self_attn.qkv_proj = torch.nn.Linear(4, 12)
    layer.mlp = torch.nn.Module()
    layer.mlp.gate_up_proj = torch.nn.Linear(4, 8, bias=False)
    p = "model.layers.0."
    assert identity_keys(layer, p) == {
        "input_layernorm.weight": f"{p}input_layernorm.weight",
        "input_layernorm.bias": f"{p}input_layernorm.bias",
        "self_attn.qkv_proj.weight": [f"{p}self_attn.{x}_proj.weight" for x in "qkv"],
        "self_attn.qkv_proj.bias": [f"{p}self_attn.{x}_proj.bias" for x in "qkv"],
        "mlp.gate_up_proj.weight": [f"{p}mlp.gate_proj.weight", f"{p}mlp.up_proj.weight"],
    }


# --- reading whole rows straight into the parameter ---------------------------------------------------


class _Rows(nn.Module):
    """Parameters whose loaders cut whole rows: fused QKV, vocab rows with padding, a replicated table."""

    def __init__(self, dtype: torch.dtype = torch.float32):
        super().__init__()
        qkv_rows = (HEADS + 2 * KV) * HEAD_DIM // 2
        self.qkv = nn.Parameter(
            torch.full((qkv_rows, HIDDEN), float("nan"), dtype=dtype), requires_grad=False
        )
        self.embed = nn.Parameter(torch.full((4, 3), float("nan"), dtype=dtype), requires_grad=False)
        self.gate_up = nn.Parameter(torch.full((6, 4), float("nan"), dtype=dtype), requires_grad=False)
        set_weight_loader(self.qkv, fused_qkv(HEADS, KV, HEAD_DIM))
        set_weight_loader(self.embed, padded_rows(4))
        set_weight_loader(self.gate_up, concat_sharded(0))


ROWS_MAP = {"qkv": ["q.weight", "k.weight", "v.weight"], "embed": "embed", "gate_up": ["gate", "up"]}
ROWS_IGNORE = ["w", "*.bias"]


def _expected_rows(rank: int) -> dict[str, torch.Tensor]:
    t, half = _tensors(), (HEADS * HEAD_DIM) // 2
    q = t["q.weight"][rank * half : (rank + 1) * half]
    k, v = (t[n][rank * HEAD_DIM : (rank + 1) * HEAD_DIM] for n in ("k.weight", "v.weight"))
    embed = t["embed"][rank * 4 : rank * 4 + 4]
    embed = torch.cat([embed, torch.zeros(4 - len(embed), 3)])
    gate_up = torch.cat([t["gate"][rank * 3 : rank * 3 + 3], t["up"][rank * 3 : rank * 3 + 3]])
    return {"qkv": torch.cat([q, k, v]), "embed": embed, "gate_up": gate_up}


@pytest.mark.parametrize("rank", [0, 1])
def test_whole_rows_are_read_straight_into_the_parameters(ckpt, rank, monkeypatch):
    from trnmodels.core.weights.safetensors_file import TensorSlice

    def no_temporaries(*args, **kwargs):
        raise AssertionError("a same-dtype whole-rows parameter must not be read into a temporary")

    monkeypatch.setattr(TensorSlice, "_rows", no_temporaries)
    model = _Rows()
    load_parameters(model, ckpt, ROWS_MAP, rank=rank, world_size=2, ignore=ROWS_IGNORE, progress=False)
    for name, expected in _expected_rows(rank).items():
        assert torch.equal(getattr(model, name).data, expected), name  # the padding rows are zeros, not NaN


def test_whole_rows_needing_a_conversion_go_through_the_loader(ckpt):
    model = _Rows(torch.bfloat16)
    load_parameters(model, ckpt, ROWS_MAP, rank=1, world_size=2, ignore=ROWS_IGNORE, progress=False)
    for name, expected in _expected_rows(1).items():
        assert torch.equal(getattr(model, name).data, expected.to(torch.bfloat16)), name


def test_a_whole_rows_value_of_the_wrong_shape_is_refused_by_the_shape_check(ckpt):
    model = _Rows()
    model.gate_up = nn.Parameter(torch.empty(6, 5), requires_grad=False)
    set_weight_loader(model.gate_up, concat_sharded(0))
    with pytest.raises(CheckpointError, match=r"gate_up expects shape \[6, 5\] on rank 0 of 2, .* \[6, 4\]"):
        load_parameters(model, ckpt, ROWS_MAP, rank=0, world_size=2, ignore=ROWS_IGNORE, progress=False)


def test_a_truncated_file_read_straight_into_a_parameter_names_it(tmp_path):
    save_file({"embed": torch.arange(15.0).reshape(5, 3)}, str(tmp_path / "model.safetensors"))
    path = tmp_path / "model.safetensors"
    with SafetensorsCheckpoint(tmp_path) as checkpoint:
        path.write_bytes(path.read_bytes()[:-8])  # the header still fits: the rows do not
        param = nn.Parameter(torch.empty(5, 3), requires_grad=False)
        module = nn.Module()
        module.embed = param
        with pytest.raises(
            CheckpointError, match=r"model.safetensors: cannot read tensor 'embed'.*end of file"
        ):
            load_parameters(module, checkpoint, {"embed": "embed"}, progress=False)
