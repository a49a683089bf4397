"""When each key was last heard: ages, the silent ones, and a bounded table that forgets the quietest."""

from stoker.accel.control.serving.last_heard import LastHeard


def test_ages_and_the_keys_silent_past_a_bound_or_heard_within_one():
    heard = LastHeard[str]()
    heard.record("a", 0.0)
    heard.record("b", 5.0)
    assert heard.age("a", 10.0) == 10.0 and heard.age("c", 10.0) is None and heard.at("b") == 5.0
    assert heard.silent_for(5.0, 10.0) == ["a"]  # b is exactly at the bound: not past it
    assert heard.silent_for(5.0, 10.0, at_least=True) == ["a", "b"]
    assert heard.heard_within(5.0, 10.0) == ["b"]
    heard.record("a", 9.0)
    assert heard.silent_for(5.0, 10.0) == [] and list(heard) == ["a", "b"]  # first-heard order kept


def test_forget_and_setdefault():
    heard = LastHeard[int]()
    heard.setdefault(1, 3.0)
    heard.setdefault(1, 7.0)  # already heard: unchanged
    assert heard.at(1) == 3.0 and 1 in heard and len(heard) == 1
    assert heard.forget(1) == 3.0 and heard.forget(1) is None and 1 not in heard


def test_a_bounded_table_forgets_the_key_heard_longest_ago():
    heard = LastHeard[str](limit=2)
    assert heard.record("a", 0.0) is None and heard.record("b", 1.0) is None
    heard.record("a", 2.0)  # a is heard again: b is now the quietest
    assert heard.record("c", 3.0) == "b"
    assert list(heard) == ["a", "c"]
