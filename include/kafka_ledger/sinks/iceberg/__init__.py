"""iceberg."""
