"""Stand-in: Mamba state parameters (no Mamba pool here)."""


class BaseLinearStateParams:
    pass
