"""trnmodels-gemma4: Gemma 4 text generation for vLLM on AWS Trainium.

Serves the language model of the published multimodal checkpoints (``Gemma4ForConditionalGeneration``,
weights under ``model.language_model.*``) and text-only ``Gemma4ForCausalLM`` exports. Importing this
package is cheap (no torch); the model is imported when core builds it through ``factory:build``.
"""

from importlib.metadata import version

from trnmodels.core.plugins import ModelPlugin

# The one version is the distribution's (pyproject.toml): a release bumps it there only.
__version__ = version("trnmodels-gemma4")

PLUGIN = ModelPlugin.declare(
    "gemma4", {"Gemma4ForConditionalGeneration": "gemma4", "Gemma4ForCausalLM": "gemma4_text"}
)
