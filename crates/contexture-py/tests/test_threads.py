"""Threads on the embedded SQLite store, in the CLI's file format."""

import json
import subprocess
import threading

import pytest

import contexture


@pytest.fixture
def db(tmp_path):
    return f"sqlite:{tmp_path / 'threads.db'}"


@pytest.fixture(scope="session")
def cli(binaries):
    """The `contexture` binary, built from this checkout."""
    return str(binaries / "contexture")


def conversation(turns):
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + "why " * 30})
        messages.append({"role": "assistant", "content": f"Answer {turn}: " + "because " * 30})
    return messages


def test_append_and_read_back(db):
    thread = contexture.Thread("chat", db=db)
    assert not thread.exists()
    seqs = thread.append(conversation(2))
    assert len(seqs) == 5 and seqs == sorted(seqs)
    assert thread.exists()
    assert thread.messages() == conversation(2)
    assert thread.messages(limit=1) == [conversation(2)[0], conversation(2)[-1]]
    one = thread.append({"role": "user", "content": "and one more"})
    assert len(one) == 1 and one[0] > seqs[-1]
    assert thread.messages()[-1] == {"role": "user", "content": "and one more"}


def test_a_retry_with_the_same_key_stores_nothing(db):
    thread = contexture.Thread("keyed", db=db)
    first = thread.append([{"role": "user", "content": "once"}], key="turn-1")
    again = thread.append([{"role": "user", "content": "once"}], key="turn-1")
    assert first == again
    assert thread.messages() == [{"role": "user", "content": "once"}]


def test_the_cli_reads_what_python_wrote_and_the_other_way(db, cli, tmp_path):
    contexture.Thread("shared", db=db).append(conversation(1))
    printed = subprocess.run(
        [cli, "thread", "messages", "--thread", "shared", "--db", db],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert json.loads(printed) == conversation(1)
    more = tmp_path / "more.json"
    more.write_text(json.dumps([{"role": "user", "content": "from the CLI"}]))
    subprocess.run(
        [cli, "thread", "append", "--thread", "shared", "--db", db, str(more)],
        check=True,
        capture_output=True,
    )
    assert contexture.Thread("shared", db=db).messages()[-1] == {
        "role": "user",
        "content": "from the CLI",
    }


def test_context_is_the_thread_fitted_for_a_model(db):
    thread = contexture.Thread("long", db=db)
    thread.append(conversation(40))
    fitted, report = thread.context("gpt-4o", max_tokens=300)
    assert fitted[0] == {"role": "system", "content": "You are terse."}
    assert report["tokens_after"] <= 300 == report["max_tokens"]
    assert report["dropped_count"] > 0
    assert report["messages_in"] == 81
    assert contexture.validate(fitted) == []
    whole, _ = thread.context("gpt-4o")
    assert whole == conversation(40)


def test_fork_and_merge(db):
    main = contexture.Thread("main", db=db)
    main.append(conversation(1))
    branch = main.fork("main-branch")
    assert branch.id == "main-branch"
    branch.append({"role": "user", "content": "explored on the branch"})
    assert main.messages() == conversation(1)
    seq = main.merge(branch)
    assert seq > 0
    assert main.messages()[-1] == {"role": "user", "content": "explored on the branch"}
    parents = {info["id"]: info.get("parent") for info in contexture.Store(db).threads()}
    assert parents["main-branch"] == "main"


def test_compact_summarizes_offline_and_keeps_every_event(db):
    thread = contexture.Thread("compacted", db=db)
    thread.append(conversation(30))
    events_before = len(thread.events())
    report = thread.compact(keep_messages=4)
    assert report["outcome"] == "compacted" and report["summarizer"] == "extractive"
    assert report["tokens_after"] < report["tokens_before"]
    messages = thread.messages()
    assert len(messages) < len(conversation(30))
    assert messages[-4:] == conversation(30)[-4:]
    # The thread is append-only: the compaction is one more event.
    assert len(thread.events()) == events_before + 1


def test_store_errors(db, tmp_path):
    with pytest.raises(contexture.StoreError, match="ghost"):
        contexture.Thread("ghost", db=db).context("gpt-4o")
    with pytest.raises(contexture.StoreError):
        contexture.Thread("ghost", db=db).fork("ghost-2")
    with pytest.raises(contexture.StoreError, match="cannot open the store"):
        contexture.Store("mysql://nowhere")
    with pytest.raises(contexture.StoreError, match="cannot open the store"):
        contexture.Store(f"sqlite:{tmp_path / 'no' / 'such' / 'dir' / 'x.db'}")
    thread = contexture.Thread("t", db=db)
    with pytest.raises(contexture.InputError, match="the list holds no message"):
        thread.append([])
    with pytest.raises(contexture.InputError, match=r"messages\[0\]\.role"):
        thread.append([{"content": "no role"}])
    thread.append({"role": "user", "content": "x"})
    with pytest.raises(contexture.InputError, match="policy"):
        thread.merge("t", policy="everything")
    with pytest.raises(contexture.InputError, match="unknown model"):
        thread.context("no-such-model")


def test_odd_thread_ids_are_just_keys(db, tmp_path):
    for id in ["../../etc/passwd", "a'; DROP TABLE events; --", "ünïcødé 🙂", " "]:
        thread = contexture.Thread(id, db=db)
        thread.append({"role": "user", "content": id})
        assert contexture.Thread(id, db=db).messages() == [{"role": "user", "content": id}]
    assert sorted(path.name for path in tmp_path.iterdir() if not path.name.startswith("threads.db")) == []


def test_appends_from_many_python_threads_are_all_kept(db):
    store = contexture.Store(db)
    errors = []

    def writer(number):
        try:
            thread = store.thread("busy")
            for turn in range(20):
                thread.append({"role": "user", "content": f"{number}:{turn}"})
        except Exception as problem:  # pragma: no cover - reported below
            errors.append(problem)

    workers = [threading.Thread(target=writer, args=(number,)) for number in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    contents = [message["content"] for message in store.thread("busy").messages()]
    assert sorted(contents) == sorted(f"{n}:{t}" for n in range(6) for t in range(20))
    for number in range(6):
        mine = [content for content in contents if content.startswith(f"{number}:")]
        assert mine == [f"{number}:{turn}" for turn in range(20)]
