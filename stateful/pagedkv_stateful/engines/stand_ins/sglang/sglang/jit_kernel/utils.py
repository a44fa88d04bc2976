"""Stand-in: kernel capability probes."""


def is_arch_support_pdl():
    return False
