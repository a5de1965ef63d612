"""Verifiers against adversarial answers, the held-out split, and the tokenizers."""

from __future__ import annotations

import json

import pytest

from plexrl.errors import ConfigError
from plexrl.rl.tasks import DigitTask, Item, MathTask, in_heldout
from plexrl.rl.tasks.gym import ReasoningGymTask
from plexrl.rl.tasks.math import answers_equal, extract_answer, load_jsonl
from plexrl.rl.tokenizers import CharTokenizer, HFTokenizer, UNKNOWN


@pytest.mark.parametrize(("completion", "score"), [
    ("321", 1.0), (" 321\n", 1.0),                            # surrounding space is fine
    ("", 0.0), ("32", 0.0), ("3210", 0.0), ("321 is it", 0.0),  # empty, short, extra text
    ("321" + "0" * 500, 0.0), ("３２１", 0.0), ("٣٢١", 0.0),     # huge, unicode digits
    ("123", 0.0), ("+321", 0.0), (UNKNOWN + "321", 0.0),
])
def test_digit_verifier_is_exact(completion, score):
    task = DigitTask("reverse", 3, 3)
    assert task.score(Item("123>", "321"), completion) == score


@pytest.mark.parametrize(("reference", "completion", "right"), [
    ("72", "so #### 72", True), ("72", "#### 72.0", True), ("72", "\\boxed{72}", True),
    ("2.5", "#### 2.50", True), ("950", "#### 950", True), ("1200", "\\boxed{1,200}", True),
    ("\\frac{5}{6}", "\\boxed{\\dfrac{5}{6}}", True), ("\\frac{5}{6}", "\\boxed{10/12}", True),
    ("72", "The answer is 72", False),               # wrong format: no marker
    ("72", "\\boxed{72 apples}", False),             # extra text inside the answer
    ("72", "\\boxed{7", False), ("72", "\\boxed{}", False), ("72", "", False),
    ("72", "#### 73", False), ("72", "\\boxed{72}\n#### 73", True),   # boxed wins
    ("1" + "0" * 400, "\\boxed{1" + "0" * 399 + "1}", False),         # huge, no rounding
    ("1" + "0" * 400, "#### 1" + "0" * 400, True), ("72", "#### 1e400", False),
    ("72", "#### ７２", False), ("72", "#### ٧٢", False),               # unicode digits
    ("72", "#### " + "9" * 9000, False),             # beyond int parsing limits
    ("x+1", "\\boxed{x + 1}", True), ("x+1", "\\boxed{x-1}", False),
])
def test_math_verifier_with_adversarial_answers(reference, completion, right):
    assert answers_equal(reference, extract_answer(completion)) is right


def test_math_jsonl_sample_loads_and_splits(tmp_path):
    task = MathTask()
    assert len(task.items) >= 12
    assert {it.answer for it in task.items} >= {"72", "\\frac{5}{6}", "2.5"}
    train = {it.prompt for it in task.sample(50, 0)}
    held = {it.prompt for it in task.sample(2, 0, "heldout")}
    assert train and held and not train & held
    item = task.items[0]
    assert task.score(item, "Altogether 72.\n#### 72") == 1.0
    assert task.score(item, "72") == 0.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(ConfigError):
        load_jsonl(bad)


@pytest.mark.parametrize("kind", ["copy", "reverse", "add"])
def test_digit_splits_are_seeded_and_disjoint(kind):
    task = DigitTask(kind, 2, 4)
    train = task.sample(500, seed=3)
    assert train == task.sample(500, seed=3) and train != task.sample(500, seed=4)
    held = task.sample(200, seed=0, split="heldout")
    assert len({it.prompt for it in held}) == 200
    assert not {it.prompt for it in train} & {it.prompt for it in held}
    assert all(in_heldout(it.prompt, 0.2) for it in held)
    assert all(task.score(it, it.answer) == 1.0 for it in held[:20])
    assert set("".join(it.prompt + it.answer for it in train)) <= set(task.alphabet)


def test_too_small_an_item_space_is_a_config_error():
    with pytest.raises(ConfigError):
        DigitTask("copy", 1, 1).sample(50, 0, "heldout")


def test_reasoning_gym_source_scores_with_its_own_score_answer():
    task = ReasoningGymTask("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                          "max_digits": 2},
                            prompt=lambda e: e["metadata"]["expression"].replace(" ", "") + "=")
    train = task.sample(100, seed=1)
    held = task.sample(50, seed=1, split="heldout")
    assert train == task.sample(100, seed=1)
    assert not {it.prompt for it in train} & {it.prompt for it in held}
    item = held[0]
    assert task.score(item, item.answer) == 1.0
    assert task.score(item, " " + item.answer + "\n") == 1.0
    for wrong in ("", "banana", str(int(item.answer) + 1), "9" * 400, "١"):
        assert task.score(item, wrong) == 0.0
    alphabet = task.fit_alphabet(200)
    assert set(alphabet) <= set("0123456789+-=")
    tok = CharTokenizer.for_tasks(task)
    tok.check_fits(64)
    assert tok.decode(tok.encode(item.prompt)) == item.prompt
    with pytest.raises(ConfigError):
        ReasoningGymTask("no_such_dataset")


def test_char_tokenizer_matches_the_tiny_configs():
    tok = CharTokenizer("0123456789=>+")
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 16)
    ids = tok.encode("12>")
    assert ids[0] == 1 and tok.decode(ids) == "12>"
    assert tok.decode(tok.encode("21", add_bos=False) + [2, 5, 6]) == "21"   # stops at eos
    assert tok.decode([0, 1, 63]) == UNKNOWN                                 # out of alphabet
    with pytest.raises(ConfigError):
        tok.encode("a")
    with pytest.raises(ConfigError):
        CharTokenizer("".join(chr(65 + i) for i in range(62))).check_fits(64)


def test_hf_tokenizer_reads_a_local_directory_only(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "[UNK]": 5}
    rust = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    rust.add_special_tokens(["<pad>", "<s>", "</s>"])
    rust.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": "<pad>"}))
    tok = HFTokenizer(tmp_path)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.encode("hello world") == [1, 3, 4]
    assert tok.decode([1, 3, 4, 2, 3]) == "hello world"
    with pytest.raises(ConfigError):
        HFTokenizer(tmp_path / "missing")


def test_reasoning_gym_answer_mapping_feeds_warm_up_while_score_answer_grades():
    """The demo's spell_backward: lower-cased prompt and reference; the dataset's own
    score_answer still grades (case-blind, partial credit for matching leading letters)."""
    from plexrl.demo.plan import demo_jobs, make_task, make_tokenizer
    job = next(j for j in demo_jobs() if j.task == "spell_backward")
    task = make_task(job)
    held = task.sample(200, seed=job.seed, split="heldout")
    assert len({it.prompt for it in held}) == 200
    assert all(it.answer == it.columns["entry"]["answer"].lower() for it in held)
    assert all(it.prompt == it.answer[::-1] + ">" for it in held)
    tok = make_tokenizer(task)
    assert tok.vocab_size <= 64 and tok.decode(tok.encode(held[0].answer)) == held[0].answer
    item = held[0]
    assert task.score(item, item.answer) == 1.0
    assert task.score(item, item.answer.upper()) == 1.0
    assert 0.0 < task.score(item, item.answer[:-1] + "#") < 1.0
    assert task.score(item, "") == 0.0
