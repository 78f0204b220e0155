"""split_granularity: how streamed text is cut into units to synthesise."""

import pytest

from session_server.speech.text_split import TextSplitter


def split(granularity: str, *chunks: str) -> list[str]:
    splitter = TextSplitter(granularity)
    units: list[str] = []
    for chunk in chunks:
        units += splitter.feed(chunk)
    return units + splitter.flush()


def split_char_by_char(granularity: str, text: str) -> list[str]:
    return split(granularity, *text)


def test_none_speaks_the_whole_flush_as_one_unit():
    splitter = TextSplitter("none")
    assert splitter.feed("One. Two! ") == []
    assert splitter.feed("Three?") == []
    assert splitter.flush() == ["One. Two! Three?"]
    assert splitter.flush() == []


def test_sentence_cuts_after_terminal_punctuation_followed_by_whitespace():
    assert split("sentence", "Hello world. How are you? Fine! Bye") == ["Hello world.", "How are you?", "Fine!", "Bye"]


def test_ascii_punctuation_at_the_end_of_a_chunk_waits_for_what_follows():
    splitter = TextSplitter("sentence")
    assert splitter.feed("It costs 3.") == []  # could be "3.14"
    assert splitter.feed("14 dollars. ") == ["It costs 3.14 dollars."]


@pytest.mark.parametrize(
    "text",
    [
        "Pi is about 3.14 and e is 2.72 here.",
        "There were 1,000,000 people.",
        "Dr. Smith and Mr. Jones arrived.",
        "Bring fruit, e.g. apples, i.e. the red ones.",
        "J. R. R. Tolkien wrote it.",
        "The U.S. team won.",
        "Version v1.2.3 shipped.",
    ],
)
def test_decimals_thousands_abbreviations_and_initials_do_not_cut(text):
    assert split_char_by_char("sentence", text) == [text]


def test_a_punctuation_run_and_closing_quotes_stay_with_their_unit():
    text = 'Wait... He said "Hello." Really?! (Yes.) Done'
    assert split_char_by_char("sentence", text) == ["Wait...", 'He said "Hello."', "Really?!", "(Yes.)", "Done"]


def test_cjk_indic_and_arabic_marks_cut_without_whitespace():
    assert split("sentence", "你好。今天好吗？很好！") == ["你好。", "今天好吗？", "很好！"]
    assert split("sentence", "नमस्ते। आप कैसे हैं॥ ठीक") == ["नमस्ते।", "आप कैसे हैं॥", "ठीक"]
    assert split("sentence", "كيف حالك؟ بخير") == ["كيف حالك؟", "بخير"]
    assert split("sentence", "嗯…好的。」") == ["嗯…", "好的。」"]


def test_clause_also_cuts_at_commas_and_semicolons_but_not_thousands():
    assert split_char_by_char("clause", "One, two; three 1,000 times.") == ["One,", "two;", "three 1,000 times."]
    assert split("clause", "你好，世界；再见") == ["你好，", "世界；", "再见"]
    assert split("clause", "مرحبا، يا عالم؛ وداعا") == ["مرحبا،", "يا عالم؛", "وداعا"]


def test_sentence_does_not_cut_at_commas():
    assert split("sentence", "One, two; three.") == ["One, two; three."]


def test_punctuation_alone_is_not_a_unit():
    assert split("sentence", "... Hello there.") == ["... Hello there."]


def test_chunked_and_whole_input_cut_the_same_way():
    text = 'Dr. Who paid $1,299.99 for it. "Really?" she asked! 你好。 Then, J. Doe left... ok'
    assert split_char_by_char("sentence", text) == split("sentence", text)
    assert split_char_by_char("clause", text) == split("clause", text)


def test_unknown_granularity_is_rejected():
    with pytest.raises(ValueError, match="split_granularity"):
        TextSplitter("word")
