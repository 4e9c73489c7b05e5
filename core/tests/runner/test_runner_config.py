"""Bucket lists: sensible defaults, and configurations that cannot work are refused by name."""

from __future__ import annotations

import pytest

from trnmodels.core.errors import ConfigError, InputError
from trnmodels.core.runner.config import RunnerConfig, SamplingParams, pick_bucket, powers_of_two
from trnmodels.core.runner.graphs import all_graph_specs


def test_default_buckets_are_powers_of_two_ending_at_the_maximum():
    cfg = RunnerConfig(max_num_seqs=6, max_model_len=1000, block_size=32)
    assert cfg.num_batched_tokens_buckets == (128, 256, 512, 1000)
    assert cfg.num_seqs_buckets == (1, 2, 4, 6)
    assert cfg.context_len_buckets == (128, 256, 512, 1024)
    assert cfg.num_blocks == 6 * 32 + 1
    assert powers_of_two(1, 1) == (1,)


def test_small_model_len_gets_one_token_bucket():
    cfg = RunnerConfig(max_num_seqs=2, max_model_len=64, block_size=16)
    assert cfg.num_batched_tokens_buckets == (64,)
    assert cfg.context_len_buckets == (64,)
    specs = [s.name for s in all_graph_specs(cfg)]
    assert specs == ["prefill_64", "decode_1x64", "decode_2x64"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(num_seqs_buckets=(1, 2)),
            r"num_seqs_buckets: the largest bucket 2 cannot hold max_num_seqs = 8",
        ),
        (dict(num_batched_tokens_buckets=(64, 128)), r"largest bucket 128 cannot hold max_model_len = 256"),
        (
            dict(context_len_buckets=(64, 128)),
            r"context_len_buckets: the largest bucket 128 cannot hold max_model_len",
        ),
        (dict(num_seqs_buckets=(4, 2, 8)), r"strictly ascending"),
        (dict(num_seqs_buckets=(0, 8)), r"positive integers"),
        (dict(context_len_buckets=(100, 256)), r"\[100\] are not multiples of block_size=32"),
        (dict(max_num_seqs=0), r"max_num_seqs: expected a positive integer"),
    ],
)
def test_bucket_configs_that_cannot_work_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        RunnerConfig(**{"max_num_seqs": 8, "max_model_len": 256, "block_size": 32, **kwargs})


def test_pick_bucket():
    assert pick_bucket((1, 2, 4, 8), 3) == 4
    assert pick_bucket((1, 2, 4, 8), 8) == 8
    with pytest.raises(InputError, match="exceeds the largest bucket 8"):
        pick_bucket((1, 2, 4, 8), 9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_sampling_params_validation(kwargs, message):
    with pytest.raises(InputError, match=message):
        SamplingParams(**kwargs)
