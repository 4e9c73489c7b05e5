import pytest

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the `eval` dependency group")


@pytest.fixture(scope="package")
def tiny_checkpoint(tmp_path_factory):
    """A random llama checkpoint of the llama3 plugin's bundled tiny config (128 positions), with a
    byte-level BPE tokenizer that prepends BOS."""
    from trnmodels.core.testing import save_random_checkpoint
    from trnmodels.llama3 import PLUGIN

    return save_random_checkpoint(PLUGIN.bundled_config_dir("tiny"), tmp_path_factory.mktemp("eval") / "tiny")


@pytest.fixture(scope="package")
def hf_model(tiny_checkpoint):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()


@pytest.fixture(scope="package")
def tokenizer(tiny_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="package")
def lm(tiny_checkpoint):
    """Ours at TP=1, eager, with a 32-token max length so rolling loglikelihood needs several windows."""
    from trnmodels.core.eval import register

    model = register()(pretrained=str(tiny_checkpoint), max_model_len=32, block_size=8, eager=True)
    yield model
    model.close()
