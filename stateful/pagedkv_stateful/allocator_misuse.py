"""The allocator machine's rules for misuse and the null block: error paths by design.

Each rule here feeds the target a call the spec rejects, or one whose only
legal answer is an error or a no-op, and checks that the target says no (with
the spec's error type when it promises typed errors) and changes nothing:

- ``free_again``: a double free (``caps.misuse``);
- ``use_stale_handle``: appending to or forking a freed block object (``caps.misuse``);
- ``foreign_block``: another allocator's block passed to ``free``, ``fork``,
  ``swap`` (``caps.misuse``);
- ``null_block``: the null block is one shared id, freeing it is a no-op and
  writing to it raises :class:`~pagedkv.errors.NullBlockError` (``caps.null_block``).

:class:`~pagedkv_stateful.allocator_machine.AllocatorMachine` inherits them.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from pagedkv.errors import ForeignBlockError, NullBlockError
from pagedkv_spec import allocator as spec
from pagedkv_spec.device import Device
from pagedkv_stateful.allocator_base import AllocatorMachineBase, or_bad

__all__ = ["AllocatorMisuseRules"]

GPU, CPU = Device.GPU, Device.CPU
dead = AllocatorMachineBase.dead


class AllocatorMisuseRules(AllocatorMachineBase):
    """Error-path rules of the allocator machine (see the module docstring)."""

    @precondition(lambda self: self.caps.misuse)
    @rule(handle=dead)
    def free_again(self, handle: int) -> None:
        """Double free: a dead handle must raise and change nothing."""
        src = f"alloc.free(b{handle})"
        res = self._attempt(lambda: self.adapter.free(self.objs[handle]))
        self._expect_rejected(res, lambda: spec.free(self.model, handle), src)

    @precondition(lambda self: self.caps.misuse)
    @rule(handle=dead, token=st.integers(0, 9))
    def use_stale_handle(self, handle: int, token: int) -> None:
        """A freed object must never append to or fork another owner's block."""
        obj = self.objs[handle]
        src = self.adapter.source_append(f"b{handle}", f"[{token}]")
        res = self._attempt(lambda: self.adapter.append_token_ids(obj, [token]))
        self._expect_rejected(
            res, lambda: spec.append_token_ids(self.model, handle, [token], -1), src
        )
        src = f"alloc.fork(b{handle})"
        forked = self._attempt(lambda: self.adapter.fork(obj))
        self._expect_rejected(forked, lambda: spec.fork(self.model, handle), src)

    @precondition(lambda self: self.caps.null_block)
    @rule()
    def null_block(self) -> None:
        src = "alloc.allocate_or_get_null_block()"
        res = self._attempt(self.adapter.allocate_or_get_null_block)
        if isinstance(res, Exception):
            self._expect_same_error(
                res, lambda: spec.allocate_or_get_null_block(self.model, -1), src
            )
            return
        null_id = self.adapter.block_id(res)
        before, first = self.model.gpu, self.model.null_id is None
        self.model, want = self._judge(
            "null block",
            lambda: spec.allocate_or_get_null_block(self.model, null_id),
            src,
            "null = ",
            lambda: self._explain_choice(GPU, [null_id], src) if first else None,
        )
        if null_id != want:
            self._violate(
                "null block",
                f"the null block has id {null_id}; the spec's null block is {want}",
                f"assert {self.adapter.source_block_id('null')} == {want}",
            )
        if self.null is not None and self.null is not res:
            self._violate("null block", "allocate_or_get_null_block returned a new object")
        if first:
            self._check_lifo(before, [or_bad(null_id)], src)
        self.null = res
        err = self._attempt(lambda: self.adapter.free(res))
        if isinstance(err, Exception):
            self._log("alloc.free(null)")
            self._violate("null block", f"alloc.free(null) raised {err!r}; it must be a no-op")
        self._log("alloc.free(null)  # a no-op")
        src = self.adapter.source_append("null", "[1]")
        err = self._attempt(lambda: self.adapter.append_token_ids(res, [1]))
        typed = self.caps.typed_errors
        if not isinstance(err, Exception) or (typed and not isinstance(err, NullBlockError)):
            name = ", 'NullBlockError'" if typed else ""
            self._violate(
                "null block",
                f"writing to the null block gave {err!r}; it must raise"
                + (" NullBlockError" if typed else ""),
                f"expect_error(lambda: {src}{name})",
            )
        self._log(f"expect_error(lambda: {src}{self._error_name(err)})")

    @precondition(lambda self: self.caps.misuse)
    @rule(token=st.integers(0, 9))
    def foreign_block(self, token: int) -> None:
        """Blocks of another allocator are rejected by every operation."""
        if self.other is None:
            self.other = self.make_adapter(1, 1, self.model.block_size)
            self.foreign = self.other.allocate_mutable_block(None, GPU)
            self._log(self.setup_source("other", 1, 1, self.model.block_size))
            self._log(f"foreign = other.allocate_mutable_block(None, {self._dev(GPU)})")
        calls: list[tuple[str, Callable[[], object]]] = [
            ("alloc.free(foreign)", lambda: self.adapter.free(self.foreign)),
            ("alloc.fork(foreign)", lambda: self.adapter.fork(self.foreign)),
        ]
        if self.caps.swap:
            code = f"alloc.swap([foreign], {self._dev(GPU)}, {self._dev(CPU)})"
            calls.append((code, lambda: self.adapter.swap([self.foreign], GPU, CPU)))
        typed = self.caps.typed_errors
        name = ", 'ForeignBlockError'" if typed else ""
        for src, call in calls:
            res = self._attempt(call)
            if not isinstance(res, Exception) or (typed and not isinstance(res, ForeignBlockError)):
                self._violate(
                    "same error as spec",
                    f"{src} gave {res!r}: a block of another allocator must be rejected"
                    + (" with ForeignBlockError" if typed else ""),
                    f"expect_error(lambda: {src}{name})",
                )
            self._log(f"expect_error(lambda: {src}{name})")
            self._check_unchanged(src, res)
