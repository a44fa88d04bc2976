"""Stand-in: SGLang's environment switches, each read from the process environment as
SGLang does (unset: its default, here None or False)."""

import os


class _Var:
    def __init__(self, name):
        self.name = name

    def get(self):
        value = os.environ.get(self.name)
        if value is None:
            return None
        if value.lower() in ("0", "1", "true", "false"):
            return value.lower() in ("1", "true")
        return value


class _Envs:
    def __getattr__(self, name):
        return _Var(name)


envs = _Envs()
