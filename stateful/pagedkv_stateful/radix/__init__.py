"""The radix machine: SGLang's radix prefix cache (``pagedkv.radix``, or another
engine's tree through a target factory) driven as SGLang's scheduler drives it."""
