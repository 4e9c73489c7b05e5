"""trnmodels core: the building blocks every trnmodels plugin is made of."""

from importlib.metadata import version

# The one version is the distribution's (pyproject.toml): a release bumps it there only.
__version__ = version("trnmodels-core")
