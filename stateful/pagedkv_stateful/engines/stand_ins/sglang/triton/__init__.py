"""Stand-in: triton. Its kernels are declared at import and never launched on the radix
cache's path (page allocation takes the Python path), so ``jit`` returns them as they are."""


def jit(fn=None, **kwargs):
    return fn if fn is not None else (lambda f: f)


def next_power_of_2(n):
    return 1 << max(0, (int(n) - 1).bit_length())
