"""Run the offload machine (pagedkv.v1.offload's CPUOffloadingManager against
pagedkv_spec.v1.offload and the LRU/ARC refinements) under the active Hypothesis profile."""

from pagedkv_stateful.v1.offload_machine import OffloadMachine

TestOffloadMachine = OffloadMachine.TestCase
