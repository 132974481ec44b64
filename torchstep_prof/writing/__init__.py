"""Writing stopped traces to disk off the training thread: the background writer, its hidden
temporary files, and finishing torch's exported JSON in place."""
