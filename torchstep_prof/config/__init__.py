"""Configuration: model, converter, files, overrides and the environment's layer.

Configuration: the frozen model, its one converter, config files, ``key=value`` overrides and
the environment's layer. Nothing here imports torch."""
