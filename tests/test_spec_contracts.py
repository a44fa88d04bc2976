"""Every public spec function has a contract, or says in its docstring why not."""

from pagedkv_spec.check import DEFAULT_TARGETS, contract_inventory


def test_every_public_spec_function_has_a_contract_or_a_reason() -> None:
    inv = contract_inventory()
    assert inv.missing == [], f"add leading asserts or an 'Exempt:' reason: {inv.missing}"
    assert len(inv.contracts) >= 40
    assert all(reason for _, reason in inv.exempt)


def test_default_crosshair_targets_have_contracts() -> None:
    contracts = set(contract_inventory().contracts)
    assert set(DEFAULT_TARGETS) <= contracts
