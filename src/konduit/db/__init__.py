"""The database boundary: the pool and its named queries, migrations, the embedded server."""

from konduit.db.connect import describe_url, open_database

__all__ = ["describe_url", "open_database"]
