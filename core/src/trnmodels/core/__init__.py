"""trnmodels core: the building blocks every trnmodels plugin is made of."""

__version__ = "0.1.0"
