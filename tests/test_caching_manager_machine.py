"""Run the caching manager machine under the active Hypothesis profile."""

from pagedkv_stateful.caching_manager_machine import CachingManagerMachine

TestCachingManagerMachine = CachingManagerMachine.TestCase
