"""The read layer, above the engine: :class:`~konduit.reads.model.ReadModel`."""

from konduit.reads.model import ReadModel

__all__ = ["ReadModel"]
