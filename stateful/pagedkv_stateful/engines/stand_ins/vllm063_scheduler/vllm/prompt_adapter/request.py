"""Stand-in: a type name the scheduler imports; the checked runs use no prompt adapter."""


class PromptAdapterRequest:
    """Type name only."""
