"""The finish hook: the command run once per rank when profiling is done.

When it runs (``finishing``), running its command (``command``, ``process``), per-node
completion (``node_sync``) and gathering other tools' traces first (``relocate``)."""
