"""Pure pieces of one pass that are not release-specific: facts, diagnosis, changes to apply, status."""
