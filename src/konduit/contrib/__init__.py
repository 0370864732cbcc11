"""Integrations with other libraries, each behind an optional extra: ``konduit.contrib.pydantic_ai``
(durable Pydantic AI agents, the ``pydantic-ai`` extra)."""
