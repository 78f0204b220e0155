"""Which items leave the model's context when the conversation would not fit (the pure policy)."""

from __future__ import annotations

from graph.messages import Truncation
from nodes.qwen3_omni.truncation import Item, items_to_drop

AUTO, DISABLED = Truncation(type="auto"), Truncation(type="disabled")


def items(*tokens: int) -> list[Item]:
    return [Item(n) for n in tokens]


def test_auto_drops_nothing_while_the_turn_fits():
    assert items_to_drop(items(100, 100), AUTO, instructions=50, incoming=100, context=400) == 0


def test_auto_drops_the_oldest_items_until_the_turn_fits_twice_over():
    # room 350; 300 + 100 > 350. Fitting once needs one item dropped (200 + 100); twice over
    # (rest + 2 x 100 <= 350) needs two, so the next turn like it appends to a kept prefix.
    assert items_to_drop(items(100, 100, 100), AUTO, instructions=50, incoming=100, context=400) == 2
    assert items_to_drop(items(50, 50, 50, 50, 50, 50), AUTO, instructions=50, incoming=100, context=400) == 3


def test_auto_fits_the_turn_once_where_twice_over_cannot_be_reached():
    # 250 twice over is 500 > 350: only once can it fit, with two of the three dropped.
    assert items_to_drop(items(100, 100, 100), AUTO, instructions=50, incoming=250, context=400) == 2
    # keep_last holds the newest item: twice over would need it gone, once needs one dropped.
    assert items_to_drop(items(100, 100, 100), AUTO, instructions=50, incoming=100, context=400, keep_last=2) == 1


def test_disabled_never_drops():
    assert items_to_drop(items(100, 100, 100), DISABLED, instructions=50, incoming=250, context=400) == 0


def test_nothing_leaves_when_the_turn_cannot_fit_even_alone():
    assert items_to_drop(items(100, 100), AUTO, instructions=50, incoming=400, context=400) == 0


def test_retention_ratio_truncates_past_its_limit_down_to_its_share():
    mode = Truncation(type="retention_ratio", retention_ratio=0.5, post_instructions=300)
    # 200 + 50 <= 300: nothing yet, though the context (1000) has room either way.
    assert items_to_drop(items(100, 100), mode, instructions=50, incoming=50, context=1000) == 0
    # 300 + 50 > 300: drop until conversation + incoming <= 150, i.e. two of the three.
    assert items_to_drop(items(100, 100, 100), mode, instructions=50, incoming=50, context=1000) == 2


def test_retention_ratio_without_a_limit_uses_the_context():
    mode = Truncation(type="retention_ratio", retention_ratio=0.8)
    # room 350; 300 + 100 > 350 -> down to 280: 100 + 100 <= 280 after dropping one... then 200+100 > 280: two.
    assert items_to_drop(items(100, 100, 100), mode, instructions=50, incoming=100, context=400) == 2


def test_a_function_output_leaves_with_its_call():
    calls = [Item(100), Item(20, pairs_with_previous=True), Item(100)]
    # 220 + 150 > 350; the last item stays. Dropping the call (100) alone would fit the turn once
    # (120 + 150), but its output goes with it.
    assert items_to_drop(calls, AUTO, instructions=0, incoming=150, context=350, keep_last=1) == 2


def test_the_last_items_never_leave_and_an_output_they_keep_keeps_its_call():
    assert items_to_drop(items(100, 100, 100), AUTO, instructions=0, incoming=200, context=300, keep_last=2) == 0
    calls = [Item(100), Item(100), Item(20, pairs_with_previous=True)]
    # keep_last=1 keeps the output; its call stays too: only the first item may leave.
    assert items_to_drop(calls, AUTO, instructions=0, incoming=190, context=400, keep_last=1) == 1
