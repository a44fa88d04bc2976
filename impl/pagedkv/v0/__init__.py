"""The V0 block layer (vLLM 0.6.3's block manager): the pools and their blocks, the
naive and prefix-caching allocators, the two-device allocator, block tables, sequences
and the block space manager. Torch-free."""
