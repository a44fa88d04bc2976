"""Stand-in: vllm.utils.mem_utils.format_gib (only in vLLM 0.27.1's error messages)."""


def format_gib(num_bytes):
    """``num_bytes`` in GiB, to two decimals, as vLLM prints it."""
    return f"{round(num_bytes / (1 << 30), 2)}"
