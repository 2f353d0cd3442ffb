"""Unit conversion at the edge. Inside the engine everything is bytes (int)."""

GiB = 2**30
MiB = 2**20
KiB = 2**10
GB = 10**9


def to_gib(n_bytes: int | float) -> float:
    return n_bytes / GiB


def fmt_gib(n_bytes: int | float, digits: int = 2) -> str:
    """'12.34 GiB' (binary gibibytes, what PyTorch and nvidia-smi's MiB columns use)."""
    return f"{n_bytes / GiB:,.{digits}f} GiB"
