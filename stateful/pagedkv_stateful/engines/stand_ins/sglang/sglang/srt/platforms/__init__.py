"""Stand-in: the platform (a CPU without Triton: the allocator takes its Python paths)."""


class _Capabilities:
    supports_triton = False


class _CpuPlatform:
    capabilities = _Capabilities()

    def is_cuda_alike(self):
        return False

    def is_out_of_tree(self):
        return False

    def synchronize(self):
        pass


current_platform = _CpuPlatform()
