"""The finish hook: when it runs, running its command, per-node sync, relocation.

The finish hook: when it runs (``finishing``), running its command (``command``), per-node
completion (``node_sync``) and gathering other tools' traces first (``relocate``)."""
