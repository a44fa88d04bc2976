"""Stand-in: the ``vllm.core`` package, holding only the wheel's ``scheduler.py``."""
