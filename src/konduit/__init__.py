"""Konduit."""
