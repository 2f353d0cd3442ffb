"""Measurement entry points for other frameworks than transformers (each framework's own model code and recipe step)."""
