"""Run the allocator lockstep machine under the active Hypothesis profile."""

from pagedkv_stateful.allocator_machine import AllocatorMachine

TestAllocatorMachine = AllocatorMachine.TestCase
