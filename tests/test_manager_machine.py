"""Run the manager lockstep machine under the active Hypothesis profile."""

from pagedkv_stateful.v0.manager_machine import ManagerMachine

TestManagerMachine = ManagerMachine.TestCase
