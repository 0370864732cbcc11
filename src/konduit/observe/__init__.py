"""Observability faces computed from the database: stats, plans and Prometheus metrics."""
