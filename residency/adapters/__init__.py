"""Adapters that run the residency policy inside other serving stacks."""
