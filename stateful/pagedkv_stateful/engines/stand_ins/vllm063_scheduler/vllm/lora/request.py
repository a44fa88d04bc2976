"""Stand-in: a type name the scheduler imports; the checked runs use no LoRA."""


class LoRARequest:
    """Type name only."""
