"""Shared pytest configuration: Hypothesis profiles (see pagedkv_stateful.profiles)."""

from pagedkv_stateful.profiles import load_default_profile

load_default_profile()
