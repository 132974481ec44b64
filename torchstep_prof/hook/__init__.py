"""The finish hook: when it runs (``finishing``), running its command (``command``, ``process``),
per-node completion (``node_sync``) and gathering other tools' traces first (``relocate``)."""
