"""Writing stopped traces to disk off the training thread.

The background writer, its hidden temporary files, and finishing torch's exported JSON in place."""
