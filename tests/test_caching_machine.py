"""Run the prefix-caching allocator lockstep machine under the active Hypothesis profile."""

from pagedkv_stateful.v0.caching_machine import CachingAllocatorMachine

TestCachingAllocatorMachine = CachingAllocatorMachine.TestCase
