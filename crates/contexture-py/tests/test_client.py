"""The client of `contexture serve`, sync and async, against a real server started by the
test (its upstream the workspace's fake provider)."""

import asyncio

import pytest

from contexture.client import (
    ApiError,
    Appended,
    AsyncClient,
    Client,
    Execution,
    FittedContext,
    ThreadSummary,
)

WORKFLOW = """\
name: greet
assistants:
  - id: greeter
    model: gpt-4o
    system_prompt: You greet people.
states:
  - id: greet
    assistant_id: greeter
    task: Say hello.
    next:
      state_id: again
  - id: again
    assistant_id: greeter
    task: Say it again.
"""


@pytest.fixture
def client(server):
    with Client(server["url"], api_key=server["keys"]["acme"]) as client:
        yield client


def test_threads_through_the_client(client, request):
    thread = f"t-{request.node.name}"
    created = client.create_thread(thread, system="Be brief.", messages=[{"role": "user", "content": "hi"}])
    assert created["id"] == thread
    appended = client.append(thread, {"role": "assistant", "content": "hello"}, idempotency_key="k1")
    assert isinstance(appended, Appended) and len(appended.seqs) == 1
    assert client.append(thread, {"role": "assistant", "content": "hello"}, idempotency_key="k1") == appended
    assert client.messages(thread) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    assert client.messages(thread, limit=1) == [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "hello"},
    ]
    summary = client.thread(thread)
    assert isinstance(summary, ThreadSummary)
    assert summary.messages == 3 and summary.context == "main"
    for turn in range(30):
        client.append(thread, [{"role": "user", "content": f"question {turn} " * 20}])
    fitted = client.context(thread, model="gpt-4o", max_tokens=200)
    assert isinstance(fitted, FittedContext)
    assert fitted.messages[0] == {"role": "system", "content": "Be brief."}
    assert fitted.budget["used"] <= 200 and fitted.fit["limit"] == 200
    client.set_policy(thread, {"context": {"strategy": "first"}})
    assert client.thread(thread).policy["context"]["strategy"] == "first"
    client.set_policy(thread, None)
    assert client.thread(thread).policy is None
    client.fork(thread, f"{thread}-fork")
    assert client.thread(f"{thread}-fork").parent == thread
    report = client.compact(thread, keep_messages=4)
    assert report["tokens_after"] < report["tokens_before"]
    client.delete_thread(f"{thread}-fork")
    with pytest.raises(ApiError) as missing:
        client.thread(f"{thread}-fork")
    assert missing.value.status == 404 and missing.value.code == "not_found"


def test_an_execution_started_followed_and_waited_for(client):
    execution_id = client.start(workflow_yaml=WORKFLOW, input="Ada")
    done = client.wait(execution_id, timeout=60)
    assert isinstance(done, Execution) and done.finished
    assert done.status == "completed"
    assert [step["state_id"] for step in done.steps] == ["greet", "again"]
    assert done.usage["input_tokens"] > 0
    events = list(client.events(execution_id))
    assert events[0].type == "run_started" and events[-1].type == "run_ended"
    assert [event.seq for event in events] == sorted(event.seq for event in events)
    resumed = list(client.events(execution_id, after=events[2].seq))
    assert resumed == events[3:]
    with pytest.raises(ApiError) as refused:
        client.start(workflow_yaml="name: broken\nstates: 7\n", input="x")
    assert refused.value.status == 400 and refused.value.param == "workflow_yaml"
    with pytest.raises(ValueError, match="either workflow"):
        client.start(input="x")


def test_the_async_client(server):
    async def scenario():
        async with AsyncClient(server["url"] + "/v1", api_key=server["keys"]["acme"]) as client:
            appended = await client.append("async-thread", [{"role": "user", "content": "hi"}])
            assert appended.seqs == [1]
            assert await client.messages("async-thread") == [{"role": "user", "content": "hi"}]
            fitted = await client.context("async-thread", model="gpt-4o")
            assert fitted.messages == [{"role": "user", "content": "hi"}]
            execution_id = await client.start(workflow_yaml=WORKFLOW, input="Bo")
            done = await client.wait(execution_id, timeout=60)
            assert done.status == "completed"
            kinds = [event.type async for event in client.events(execution_id)]
            assert kinds[0] == "run_started" and kinds[-1] == "run_ended"
            with pytest.raises(ApiError):
                await client.thread("no-such-thread")

    asyncio.run(scenario())


def test_tenants_see_only_their_own(server, client):
    client.append("acme-secret", [{"role": "user", "content": "acme only"}])
    execution_id = client.start(workflow_yaml=WORKFLOW, input="acme")
    with Client(server["url"], api_key=server["keys"]["globex"]) as other:
        for read in (
            lambda: other.messages("acme-secret"),
            lambda: other.thread("acme-secret"),
            lambda: other.context("acme-secret", model="gpt-4o"),
            lambda: other.execution(execution_id),
            lambda: list(other.events(execution_id)),
        ):
            with pytest.raises(ApiError) as hidden:
                read()
            assert hidden.value.status == 404
        # The same id is the other tenant's own thread.
        other.append("acme-secret", [{"role": "user", "content": "globex's"}])
        assert other.messages("acme-secret") == [{"role": "user", "content": "globex's"}]
    assert client.messages("acme-secret") == [{"role": "user", "content": "acme only"}]
    client.wait(execution_id, timeout=60)


def test_a_bad_key_and_hostile_ids(server, client):
    with Client(server["url"], api_key="ctx_not_a_key") as stranger:
        with pytest.raises(ApiError) as refused:
            stranger.messages("anything")
        assert refused.value.status == 401
    # An id is one path segment, whatever it holds: it never reaches another route.
    for hostile in ["../executions", "a/b", "x?limit=1", "%2e%2e", "t#frag", "ü 🙂"]:
        client.append(hostile, [{"role": "user", "content": hostile}])
        assert client.messages(hostile) == [{"role": "user", "content": hostile}]
        assert client.thread(hostile).id == hostile
    with pytest.raises(ValueError):
        client.messages("")
