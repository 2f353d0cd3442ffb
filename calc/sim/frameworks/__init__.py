"""Block builders of training frameworks other than transformers, one module each (litgpt.py, ...)."""
