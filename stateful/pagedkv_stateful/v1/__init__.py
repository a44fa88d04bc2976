"""Hypothesis machines for vLLM V1's KV cache manager (:mod:`pagedkv.v1`) against its spec
(:mod:`pagedkv_spec.v1`): :class:`~pagedkv_stateful.v1.manager_machine.V1ManagerMachine`."""
