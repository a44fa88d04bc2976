"""Run the V1 manager machine (pagedkv.v1 against pagedkv_spec.v1) under the active
Hypothesis profile."""

from pagedkv_stateful.v1.manager_machine import V1ManagerMachine

TestV1ManagerMachine = V1ManagerMachine.TestCase
