"""The names of the ``TORCHSTEP_PROF_*`` variables the environment's layer reads.

A leaf module, so the package's import can look at them without loading the configuration
model."""

__all__ = ["ENV_CHILDREN", "ENV_CONFIG", "ENV_OVERRIDES", "ENV_OWNER", "ENV_SUMMARY"]

ENV_CONFIG = "TORCHSTEP_PROF_CONFIG"
"""A config file (``.json``, ``.yaml``/``.yml``, ``.toml``) that replaces the code's config."""
ENV_OVERRIDES = "TORCHSTEP_PROF_OVERRIDES"
"""``key=value`` overrides, split like a shell command line, applied on top."""
ENV_SUMMARY = "TORCHSTEP_PROF_SUMMARY"
"""``0`` / ``false`` / ``no`` / ``off`` turns the summary at exit off."""
ENV_OWNER = "TORCHSTEP_PROF_OWNER"
"""Set by the process that read the two variables above: ``<pid>:<digest of their values>``."""
ENV_CHILDREN = "TORCHSTEP_PROF_CHILDREN"
"""``1``: child processes use the configuration they inherit too."""
