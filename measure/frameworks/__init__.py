"""Reference loops of other training frameworks (each in its own module), reached from `python -m measure` when
the scenario's training.framework names one."""
