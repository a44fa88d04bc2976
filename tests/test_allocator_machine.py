"""Run the allocator lockstep machine under the active Hypothesis profile."""

from pagedkv_stateful.v0.allocator_machine import AllocatorMachine

TestAllocatorMachine = AllocatorMachine.TestCase
