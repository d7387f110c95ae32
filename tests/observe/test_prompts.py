"""Prompt datasets: reading ShareGPT and text-column files, fitting a prompt to each request's
length, and what the server receives (plain requests, prefix groups, closed-loop sessions)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simpy_llm import scenario_from_dict
from simpy_llm.cli import main
from simpy_llm.observe.client import OpenAIClient
from simpy_llm.observe.loadgen import OBSERVER_COLUMNS, LoadGenerator, load_requests
from simpy_llm.observe.prompts import (
    DatasetPrompts,
    PromptDatasetError,
    SyntheticPrompts,
    chars_tokens,
    fit_text,
    load_prompts,
)
from simpy_llm.observe.run import observe
from simpy_llm.observe.sessions import Conversations
from simpy_llm.workload.export import generate_requests
from simpy_llm.workload.traces import TraceV2Writer, read_trace_v2
from tests.helpers import tiny_scenario
from tests.observe.fake_server import OK_TOKENS, FakeServer, serve
from tests.observe.fake_thread import fake_server_thread

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "What is the capital of France?"}, {"from": "gpt", "value": "Paris."}]},
    {"id": "b", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "  Name three primes.  "}]},
    {"id": "c", "conversations": [{"from": "gpt", "value": "Only an answer."}]},
    {"id": "d", "conversations": [{"from": "human", "value": "Explain how a hash table handles collisions, with an example."}]},
]
PROMPTS = ("What is the capital of France?", "Name three primes.", "Explain how a hash table handles collisions, with an example.")


def _write(path: Path, rows: Any, jsonl: bool = False) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n" if jsonl else json.dumps(rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------ reading datasets


def test_sharegpt_gives_each_conversation_its_first_human_turn(tmp_path: Path) -> None:
    """A ShareGPT file is found by its `conversations` field; each prompt is the first human turn
    (stripped), and a conversation without one is skipped and counted."""
    ds = load_prompts(_write(tmp_path / "sharegpt.json", SHAREGPT))
    assert (ds.field, ds.prompts, ds.skipped) == ("conversations", PROMPTS, 1)


def test_text_columns_are_found_in_order(tmp_path: Path) -> None:
    """JSONL and JSON records: `prompt` is preferred to `text` and `question`; `text` and
    `question` are found when alone; a JSON list of strings is a list of prompts."""
    both = _write(tmp_path / "both.jsonl", [{"text": "not this", "prompt": "first"}, {"prompt": "second", "question": "no"}], jsonl=True)
    assert load_prompts(both).prompts == ("first", "second")
    assert load_prompts(_write(tmp_path / "t.jsonl", [{"text": "a b"}, {"text": ""}], jsonl=True)).prompts == ("a b",)
    q = load_prompts(_write(tmp_path / "q.json", [{"question": "why?", "answer": "because"}]))
    assert (q.field, q.prompts) == ("question", ("why?",))
    assert load_prompts(_write(tmp_path / "s.json", ["one", "two"])).prompts == ("one", "two")


def test_a_named_field_is_read(tmp_path: Path) -> None:
    """With a field named, that field is read (records lacking it are skipped), even when a
    field of the automatic list is present too."""
    path = _write(tmp_path / "i.jsonl", [{"instruction": "do it", "text": "t"}, {"text": "only text"}], jsonl=True)
    ds = load_prompts(path, "instruction")
    assert (ds.field, ds.prompts, ds.skipped) == ("instruction", ("do it",), 1)


@pytest.mark.parametrize(
    ("content", "field", "message"),
    [
        (None, None, "cannot read"),
        ("", None, "is empty"),
        ('{"text": "ok"}\n{"text": \n', None, "line 2: not valid JSON"),
        ('{"body": "x", "id": 1}\n', None, "keys 'body', 'id', none of prompt, text, question, conversations"),
        ('{"text": "x"}\n', "instruction", "no prompt found (1 records, none with a non-empty field 'instruction')"),
        ("42", None, "expected a JSON list of records"),
    ],
)
def test_unusable_datasets_are_named_errors(tmp_path: Path, content: str | None, field: str | None, message: str) -> None:
    """A missing, empty, malformed or prompt-less file raises PromptDatasetError naming the file and why."""
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PromptDatasetError) as info:
        load_prompts(path, field)
    assert str(path) in str(info.value) and message in str(info.value)


# ------------------------------------------------------------------ choosing and fitting


def test_the_closest_prompt_is_cut_or_repeated_to_the_length() -> None:
    """A request gets the prompt closest in chars/4 tokens to its length, cut to 4 characters
    per token when longer, repeated (joined by a space) when shorter."""
    p = DatasetPrompts(["aaaa bbbb", "x" * 20, "y" * 40], seed=0)  # 3, 5 and 10 tokens
    assert p.text(2, request_id=0) == "aaaa bbb"
    assert p.text(6, request_id=0) == "x" * 20 + " xxx"
    assert p.text(12, request_id=0) == "y" * 40 + " " + "y" * 7
    assert all(chars_tokens(p.text(n, request_id=n)) == n for n in range(1, 40))


@given(
    texts=st.lists(st.text(min_size=1, max_size=60).filter(str.strip), min_size=1, max_size=8),
    n=st.integers(1, 30),
    m=st.integers(1, 30),
    rid=st.integers(0, 10**6),
)
def test_every_fit_measures_its_length_and_comes_from_a_closest_prompt(texts: list[str], n: int, m: int, rid: int) -> None:
    """Whatever the prompts and lengths: the text sent measures exactly the length asked, it is
    the fit of a prompt no farther from that length than any other, and a shorter fit of a text
    is a prefix of a longer one."""
    p = DatasetPrompts(texts, seed=11)
    sent = p.text(n, request_id=rid)
    best = min(abs(chars_tokens(t) - n) for t in texts)
    assert chars_tokens(sent) == n
    assert any(sent == fit_text(t, n) and abs(chars_tokens(t) - n) == best for t in texts)
    short, long = sorted((n, m))
    assert fit_text(texts[0], long).startswith(fit_text(texts[0], short))


def test_ties_are_drawn_with_the_seed() -> None:
    """Among equally close prompts the choice is random, the same for the same seed and request,
    and different with another seed."""
    texts = ["alpha", "bravo", "charl"]  # 2 tokens each

    def picks(seed: int) -> list[str]:
        p = DatasetPrompts(texts, seed=seed)
        return [p.text(2, request_id=i) for i in range(30)]

    assert set(picks(1)) == {"alpha al", "bravo br", "charl ch"}
    assert picks(1) == picks(1) != picks(2)


def test_a_group_prefix_is_one_text_at_every_length() -> None:
    """A prefix group's text is chosen once: shorter prefixes of the group are prefixes of longer ones."""
    p = DatasetPrompts(list(PROMPTS), seed=3)
    short, long = p.prefix("sys", 3), p.prefix("sys", 40)
    assert long.startswith(short) and chars_tokens(long) == 40 and p.prefix("sys", 3) == short


# ------------------------------------------------------------------ what the server receives


def _gen_run(rows: list[dict[str, Any]], prompts: Any, path: Path, **kw: Any) -> FakeServer:
    async def go() -> FakeServer:
        async with serve() as fake, OpenAIClient(fake.url, timeout_s=2.0) as client:
            with TraceV2Writer(path, extra_columns=OBSERVER_COLUMNS) as writer:
                await LoadGenerator(client, rows, writer, prompts=prompts, lag_threshold_s=1e9, **kw).run()
        return fake

    return asyncio.run(go())


def test_the_server_receives_dataset_prompts_fitted_to_each_request(tmp_path: Path) -> None:
    """Each request's message is its dataset prompt fitted to its drawn length, and the trace
    records that length by the chars/4 rule beside the requested one."""
    prompts = DatasetPrompts(list(PROMPTS), seed=7)
    rows = [{"request_id": i, "arrival_time_s": 0.0, "input_tokens": n, "output_tokens": OK_TOKENS} for i, n in enumerate([3, 8, 15, 40])]
    fake = _gen_run(rows, prompts, tmp_path / "t")
    sent = sorted((b["messages"] for b in fake.bodies), key=lambda m: len(m[0]["content"]))
    assert [m[0]["content"] for m in sent] == [prompts.text(r["input_tokens"], r["request_id"]) for r in rows]
    assert all(len(m) == 1 and m[0]["role"] == "user" for m in sent)
    f = read_trace_v2(tmp_path / "t").frame.sort_values("request_id")
    assert f.approx_input_tokens.tolist() == [3, 8, 15, 40] == f.requested_input_tokens.tolist()


def test_prefix_groups_share_a_dataset_prefix(tmp_path: Path) -> None:
    """Requests of a prefix group send the group's same dataset text as their system message,
    then their own dataset prompt for the rest of their length."""
    prompts = DatasetPrompts(list(PROMPTS), seed=7)
    rows = [
        {"request_id": i, "arrival_time_s": 0.0, "input_tokens": n, "output_tokens": OK_TOKENS, "prefix_group": "sys"}
        for i, n in enumerate([10, 14])
    ]
    fake = _gen_run(rows, prompts, tmp_path / "t", prefixes={"sys": 6})
    sent = sorted((b["messages"] for b in fake.bodies), key=lambda m: len(m[1]["content"]))
    system = prompts.prefix("sys", 6)
    assert [m[0] for m in sent] == [{"role": "system", "content": system}] * 2
    assert [m[1]["content"] for m in sent] == [prompts.text(4, 0), prompts.text(8, 1)]
    assert any(system.startswith(fit_text(p, 1)) for p in PROMPTS)


def _session_scenario(rounds: int = 3) -> Any:
    data = tiny_scenario()
    data["workload"] = {
        "aggregate_rate": 40.0,
        "num_requests": 2,
        "clients": [
            {
                "id": "chat",
                "rate_fraction": 1.0,
                "arrival": {"process": "poisson"},
                "prefix_group": "sys",
                "prefix_length": 5,
                "input_distribution": {"type": "constant", "params": {"value": 9}},
                "output_distribution": {"type": "constant", "params": {"value": OK_TOKENS}},
                "multi_turn": {"max_rounds": rounds, "think_time": {"type": "constant", "params": {"value": 0.01}}},
            }
        ],
    }
    return scenario_from_dict(data)


def test_sessions_ask_dataset_questions_and_carry_the_replies(tmp_path: Path) -> None:
    """In a closed-loop session every question is a dataset prompt fitted to the drawn question
    length, the system prefix is the group's dataset text, and later rounds carry the earlier
    questions and the server's own replies."""
    scenario = _session_scenario()
    requests = load_requests(generate_requests(scenario))
    prompts = DatasetPrompts(list(PROMPTS), seed=5)
    conversations = Conversations(scenario, requests, prompts=prompts)
    fake = _gen_run(requests, prompts, tmp_path / "t", conversations=conversations)
    third = [b["messages"] for b in fake.bodies if len(b["messages"]) == 6]
    assert len(third) == 2 and len(fake.bodies) == 6
    questions = {fit_text(p, 9) for p in PROMPTS}
    reply = "".join(f" t{i}" for i in range(OK_TOKENS))
    for messages in third:
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
        assert messages[0]["content"] == prompts.prefix("sys", 5)
        assert {messages[i]["content"] for i in (1, 3, 5)} <= questions
        assert messages[2]["content"] == messages[4]["content"] == reply
    earlier = {tuple(m["content"] for m in b["messages"]) for b in fake.bodies}
    for messages in third:  # the third round extends its session's second round, which extends the first
        contents = tuple(m["content"] for m in messages)
        assert contents[:4] in earlier and contents[:2] in earlier
    f = read_trace_v2(tmp_path / "t").frame
    first = f[f.round_index == 0]
    assert (first.approx_input_tokens == first.requested_input_tokens).all()
    later = f[f.round_index == 2]
    assert (later.approx_input_tokens == 5 + 9 + chars_tokens(reply) + 9 + chars_tokens(reply) + 9).all()


def test_synthetic_prompts_are_the_default(tmp_path: Path) -> None:
    """Without a dataset the prompts are synthetic words, measured one token per word."""
    rows = [{"request_id": 0, "arrival_time_s": 0.0, "input_tokens": 12, "output_tokens": OK_TOKENS}]
    fake = _gen_run(rows, None, tmp_path / "t")
    assert fake.bodies[0]["messages"][0]["content"] == SyntheticPrompts().text(12, 0)
    assert read_trace_v2(tmp_path / "t").frame.approx_input_tokens.tolist() == [12]


# ------------------------------------------------------------------ observe() and the command


def _observe_scenario(tmp_path: Path, seed: int = 4) -> Path:
    data = tiny_scenario(seed=seed)
    constant = {"type": "constant", "params": {"value": OK_TOKENS}}
    data["workload"] = {
        "aggregate_rate": 100.0,
        "num_requests": 8,
        "clients": [
            {
                "id": "chat",
                "rate_fraction": 0.5,
                "arrival": {"process": "poisson"},
                "prefix_group": "sys",
                "prefix_length": 4,
                "input_distribution": {"type": "constant", "params": {"value": 10}},
                "output_distribution": constant,
                "multi_turn": {"max_rounds": 2, "think_time": {"type": "constant", "params": {"value": 0.01}}},
            },
            {
                "id": "plain",
                "rate_fraction": 0.5,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "uniform", "params": {"low": 3, "high": 30}},
                "output_distribution": constant,
            },
        ],
    }
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_observe_sends_the_dataset_and_records_the_rule(tmp_path: Path) -> None:
    """observe(..., prompts=FILE): the trace header names the dataset, its field and the chars/4
    rule; open-loop requests get exactly the prompts the workload seed chooses; the session
    client's system prefix is one text; first rounds measure their requested lengths."""
    scenario = _observe_scenario(tmp_path)
    dataset = _write(tmp_path / "sharegpt.json", SHAREGPT)
    with fake_server_thread() as fake:
        summary = observe(scenario, fake.url, tmp_path / "run", prompts=dataset, timeout_s=5.0)
    trace = read_trace_v2(tmp_path / "run" / "trace")
    assert trace.header["prompts"] == {
        "source": "dataset", "file": str(dataset), "field": "conversations", "prompts": 3, "skipped": 1, "token_rule": "chars/4"
    }
    f = trace.frame
    assert summary.status_counts == {"ok": len(f)} and (f.client_id == "chat").any() and (f.client_id == "plain").any()
    expected = DatasetPrompts(list(PROMPTS), seed=4)
    plain = f[f.client_id == "plain"]
    singles = sorted(b["messages"][0]["content"] for b in fake.bodies if len(b["messages"]) == 1)
    assert singles == sorted(expected.text(n, r) for r, n in zip(plain.request_id, plain.requested_input_tokens, strict=True))
    systems = {b["messages"][0]["content"] for b in fake.bodies if len(b["messages"]) > 1}
    assert systems == {expected.prefix("sys", 4)}
    first = f[f.round_index == 0]
    assert (first.approx_input_tokens == first.requested_input_tokens).all()


def test_observe_command_reads_a_named_field(tmp_path: Path) -> None:
    """`simpy-llm observe --prompts FILE --prompt-field NAME` sends that field's prompts."""
    scenario = _observe_scenario(tmp_path)
    dataset = _write(tmp_path / "p.jsonl", [{"instruction": p, "text": "never this"} for p in PROMPTS], jsonl=True)
    with fake_server_thread() as fake:
        code = main(
            ["observe", str(scenario), "--url", fake.url, "--out", str(tmp_path / "run"), "--prompts", str(dataset),
             "--prompt-field", "instruction", "--timeout", "5"]
        )
    assert code == 0
    assert read_trace_v2(tmp_path / "run" / "trace").header["prompts"]["field"] == "instruction"
    texts = [m["content"] for b in fake.bodies for m in b["messages"] if m["role"] != "assistant"]
    assert texts and not any("never" in t for t in texts)
    assert all(any(t == fit_text(p, chars_tokens(t)) for p in PROMPTS) for t in texts)


def test_observe_command_rejects_a_bad_dataset_before_sending(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A prompt dataset without prompts stops the command with exit status 2 and the reason,
    before any request (no server is listening at the URL)."""
    dataset = _write(tmp_path / "p.jsonl", [{"body": "x"}], jsonl=True)
    code = main(["observe", str(_observe_scenario(tmp_path)), "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "run"),
                 "--prompts", str(dataset)])
    assert code == 2 and "no prompt field" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ synthetic words and the workload's seed


def _sent_texts(fake: FakeServer) -> list[str]:
    """Every prompt text the server received (own texts and system prefixes; not the replies
    that later rounds carry back)."""
    return [m["content"] for b in fake.bodies for m in b["messages"] if m["role"] != "assistant"]


def _observed_texts(tmp_path: Path, seed: int) -> list[str]:
    tmp_path.mkdir()
    scenario = _observe_scenario(tmp_path, seed=seed)
    with fake_server_thread() as fake:
        observe(scenario, fake.url, tmp_path / "run", timeout_s=5.0)
    return _sent_texts(fake)


def _common_words(a: str, b: str) -> int:
    """How many leading words *a* and *b* share."""
    n = 0
    for x, y in zip(a.split(), b.split(), strict=False):
        if x != y:
            break
        n += 1
    return n


def test_workloads_of_different_seeds_share_no_prompt(tmp_path: Path) -> None:
    """One workload spec observed with seeds 4 and 5 (the same clients, a prefix group among them,
    and request ids 0..n in both): no text sent in one run, system prompt included, is sent in
    the other, nor opens with the same 8 words as one of them, so a server's prefix cache finds
    nothing of the first run in the second (by chance, 8 shared words out of the ~300 in use
    would happen with a probability below 1e-17 per pair)."""
    first = _observed_texts(tmp_path / "a", seed=4)
    second = _observed_texts(tmp_path / "b", seed=5)
    assert len(first) >= 8 and len(second) >= 8
    assert not set(first) & set(second)
    assert max(_common_words(a, b) for a in first for b in second) < 8


def test_the_same_workload_and_seed_send_the_same_prompts(tmp_path: Path) -> None:
    """Observing one workload twice with the same seed sends the same texts (synthetic words are
    drawn from the workload's seed and the request id, nothing else), and a prefix group's
    requests share one system prompt."""
    first = _observed_texts(tmp_path / "a", seed=4)
    second = _observed_texts(tmp_path / "b", seed=4)
    assert sorted(first) == sorted(second)
    assert SyntheticPrompts(seed=4).prefix("sys", 4) in first


def test_synthetic_words_depend_on_the_seed_and_the_request_id() -> None:
    """SyntheticPrompts(seed).text(n, id): the same for the same seed and id, different when
    either changes; a prefix group's words differ between seeds and groups."""
    four, five = SyntheticPrompts(seed=4), SyntheticPrompts(seed=5)
    assert four.text(20, 3) == SyntheticPrompts(seed=4).text(20, 3)
    assert four.text(20, 3) != five.text(20, 3)
    assert four.text(20, 3) != four.text(20, 4)
    assert four.prefix("sys", 20) != five.prefix("sys", 20) != five.prefix("other", 20)
