"""Stand-in: vllm.v1.kv_hints."""


class KvHintsEnvelope:
    """Type name only: no KV hints are sent."""
