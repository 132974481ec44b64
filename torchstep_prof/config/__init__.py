"""Configuration: model, converter, files, overrides and the environment's layer.

The model is frozen, the converter is the package's only one, overrides are ``key=value``
strings. Nothing here imports torch."""
