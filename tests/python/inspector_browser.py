"""The inspector page (`/ui` of `contexture serve`) in a real browser: Debian's Chromium driven
by Playwright (both pinned and installed by .ci/run; nothing is downloaded).

Signs in with a key, opens an execution the test made and checks what it shows against what
the API answers (each call's budget parts, the messages sent), that markup in a message is
shown as text and runs nothing, that another tenant's key finds nothing, that a running
execution is followed live to its end, that one is cancelled after a confirmation, that
every control is reached with the keyboard, and that no console error was logged; saves
screenshots at 1280 and 390 px wide.

Environment: CONTEXTURE_BASE_URL (the server's `/v1`), CONTEXTURE_API_KEY (tenant acme),
OTHER_API_KEY (tenant zeta), DONE_EXECUTION (a finished execution of acme), LIVE_WORKFLOW and
CANCEL_WORKFLOW (workflows this script starts), SCREENSHOT_DIR. Prints one JSON summary.
"""

import json
import os
import sys
import tempfile
import time
import urllib.request

from playwright.sync_api import expect, sync_playwright

BASE = os.environ["CONTEXTURE_BASE_URL"].removesuffix("/v1")
KEY = os.environ["CONTEXTURE_API_KEY"]
OTHER_KEY = os.environ["OTHER_API_KEY"]
DONE = os.environ["DONE_EXECUTION"]
THREAD = os.environ["THREAD"]
FORK = THREAD + "-branch"
FORK2 = THREAD + "-branch-2"
BIG_THREAD = os.environ["BIG_THREAD"]
BIG_EVENTS = int(os.environ["BIG_EVENTS"])
BIG_RUN = os.environ["BIG_EXECUTION"]
SHOTS = os.environ["SCREENSHOT_DIR"]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def api(method, path, key=KEY, body=None):
    request = urllib.request.Request(
        BASE + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def all_requests(execution):
    requests, after = [], 0
    while True:
        page = api("GET", f"/v1/executions/{execution}/requests?after={after}&limit=100")
        requests += page["requests"]
        if page["next_after"] is None:
            return requests
        after = page["next_after"]


def parts(budget):
    """The five parts of a recorded budget, as the inspector draws them."""
    system, tools = budget["system"], budget["tools"]
    history = budget["pinned"] + budget["summary"] + budget["messages"] + budget["reply_priming"]
    reserve = budget["reserve_output"]
    free = max(0, budget["usable"] - (system + tools + history + reserve))
    return {"system": system, "tools": tools, "history": history, "reserve": reserve, "free": free}


def check_context(page, thread, model):
    """The context shown equals what the API answers: budget parts and what was left out."""
    answer = api("GET", f"/v1/threads/{thread}/context?model={model}")
    for name, tokens in parts(answer["budget"]).items():
        shown = page.locator(f"[data-context-budget] dd[data-part='{name}'], figure.budget dd[data-part='{name}']").first.inner_text()
        assert int(shown) == tokens, (thread, name, shown, tokens)
    dropped = sum(end - start for start, end in answer["fit"].get("dropped", []))
    assert int(page.locator("[data-field=dropped-count]").inner_text()) == dropped, (thread, dropped)
    ranges = page.locator("[data-dropped]").all_inner_texts()
    wanted = [
        f"message {start}" if end - start == 1 else f"messages {start} to {end - 1}"
        for start, end in answer["fit"].get("dropped", [])
    ]
    assert ranges == wanted, (ranges, wanted)
    total = int(page.locator("[data-field=sent-count]").inner_text())
    assert total == len(answer["messages"]), (total, len(answer["messages"]))
    # The newest of them are drawn (at most 200), each at its place in the request.
    shown = page.locator("details.sent li.message")
    assert shown.count() == min(200, total), (shown.count(), total)
    assert shown.last.get_attribute("value") == str(total - 1)


def sign_in(page, key):
    page.goto(BASE + "/ui")
    expect(page.locator("#sign-in")).to_be_visible()
    page.locator("#api-key").fill(key)
    page.keyboard.press("Enter")
    expect(page.locator("#open-form")).to_be_visible()


def open_by_keyboard(page, kind, ident):
    """Opens an execution or thread with the keyboard only: the open form's fields in turn."""
    page.locator("#open-kind").focus()
    page.keyboard.press("ArrowDown" if kind == "threads" else "ArrowUp")
    page.keyboard.press("Tab")
    page.keyboard.type(ident)
    page.keyboard.press("Enter")


def tab_stops(page, limit=400):
    """The elements the Tab key reaches, in order, from the top of the page."""
    # From the page's first control, the brand link.
    page.locator(".brand").focus()
    seen = ["a|" + page.locator(".brand").inner_text()]
    for _ in range(limit):
        page.keyboard.press("Tab")
        stop = page.evaluate(
            """() => {
                const e = document.activeElement;
                if (!e || e === document.body) return null;
                return e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + '|' + (e.textContent || '').trim().slice(0, 40);
            }"""
        )
        if stop is None or (seen and stop == seen[0]):
            break
        seen.append(stop)
    return seen


def main():
    summary = {}
    errors = []
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path="/usr/bin/chromium",
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        # CI runs this beside other tests on two cores: waits for a view are generous, and
        # the open times are judged by the fastest of several opens.
        context.set_default_timeout(30_000)
        expect.set_options(timeout=30_000)
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))

        # The key is checked before it is kept; a wrong one is refused.
        page.goto(BASE + "/ui")
        page.locator("#api-key").fill("ctx_wrong_key")
        page.keyboard.press("Enter")
        expect(page.locator("#sign-in-error")).to_contain_text("refused")
        errors.clear()  # The refused key's 401 is logged by the browser, as it should be.
        sign_in(page, KEY)
        assert page.evaluate("sessionStorage.length") == 1
        assert KEY not in page.url

        # A finished execution, opened with the keyboard.
        open_by_keyboard(page, "executions", DONE)
        view = page.locator("[data-view=execution]")
        expect(view).to_have_attribute("data-status", "completed")
        requests = all_requests(DONE)
        calls = page.locator("article.call")
        expect(calls).to_have_count(len(requests))
        checked = 0
        for call_report in requests:
            record = call_report["request"]
            call = page.locator(f"article[data-call='{call_report['number']}']")
            want = parts(record["breakdown"])
            for name, tokens in want.items():
                shown = call.locator(f"dd[data-part='{name}']").inner_text()
                assert int(shown) == tokens, (call_report["number"], name, shown, tokens)
            usable = call.locator("[data-window=usable]").inner_text()
            assert int(usable) == record["breakdown"]["usable"]
            sent = call.locator("details.sent li.message")
            assert sent.count() == len(record["messages"]), call_report["number"]
            # The usage shown is the usage the provider reported.
            usage = call_report["end"]["usage"]
            expect(call.locator("[data-field=usage]")).to_contain_text(
                f"{usage['input_tokens']} in / {usage['output_tokens']} out"
            )
            checked += 1
        summary["calls_checked"] = checked

        # A message holding markup shows as text and runs nothing.
        first = page.locator("article.call").first
        first.locator("details.sent summary").click()
        expect(first.locator("details.sent")).to_contain_text("<script>window.pwned = 1</script>")
        assert page.evaluate("window.pwned === undefined")
        assert page.locator("main img").count() == 0

        page.screenshot(path=os.path.join(SHOTS, "execution-1280.png"), full_page=False)
        page.set_viewport_size({"width": 390, "height": 844})
        page.screenshot(path=os.path.join(SHOTS, "execution-390.png"), full_page=False)
        page.set_viewport_size({"width": 1280, "height": 900})

        # Every control is reached with the keyboard.
        stops = tab_stops(page)
        for wanted in ["select#open-kind", "input#open-id", "button#sign-out"]:
            assert any(stop.startswith(wanted) for stop in stops), (wanted, stops)
        summaries = page.locator("summary").count()
        reached = sum(1 for stop in stops if stop.startswith("summary"))
        assert reached == summaries, (reached, summaries, stops)
        summary["tab_stops"] = len(stops)

        # Another tenant's key: the same id is not found.
        other = context.new_page()
        other.on("console", lambda m: None)
        sign_in(other, OTHER_KEY)
        open_by_keyboard(other, "executions", DONE)
        expect(other.locator("#content h1")).to_have_text("Not found")
        other.close()

        # A running execution, followed live to its end without a reload.
        live = api("POST", "/v1/executions", body={"workflow_yaml": os.environ["LIVE_WORKFLOW"], "input": "follow me"})["id"]
        page.goto(BASE + f"/ui#/executions/{live}")
        expect(page.locator("#live")).to_be_visible()
        expect(page.locator("[data-view=execution]")).to_have_attribute("data-status", "running")
        started = time.monotonic()
        expect(page.locator("[data-view=execution]")).to_have_attribute("data-status", "completed", timeout=30_000)
        summary["live_followed_s"] = round(time.monotonic() - started, 2)
        expect(page.locator("#live")).to_be_hidden()
        assert page.locator("article.call").count() == len(all_requests(live))

        # A running execution cancelled, after a confirmation, with the keyboard.
        doomed = api("POST", "/v1/executions", body={"workflow_yaml": os.environ["CANCEL_WORKFLOW"], "input": "stop me"})["id"]
        page.goto(BASE + f"/ui#/executions/{doomed}")
        expect(page.locator("#cancel-run")).to_be_visible()
        page.locator("#cancel-run").focus()
        page.keyboard.press("Enter")
        expect(page.locator("#cancel-confirm")).to_be_visible()
        # The focus is on "keep it running": Enter there cancels nothing.
        page.keyboard.press("Enter")
        expect(page.locator("#cancel-confirm")).to_be_hidden()
        assert api("GET", f"/v1/executions/{doomed}")["cancel_requested"] is False
        page.locator("#cancel-run").click()
        page.screenshot(path=os.path.join(SHOTS, "cancel-1280.png"))
        page.locator("#cancel-yes").click()
        expect(page.locator("[data-view=execution]")).to_have_attribute("data-status", "cancelled", timeout=30_000)
        assert api("GET", f"/v1/executions/{doomed}")["status"] == "cancelled"

        # The list: newest first, searched by id.
        page.goto(BASE + "/ui#/")
        expect(page.locator("[data-view=home]")).to_be_visible()
        listed = page.locator("tr[data-row]").evaluate_all("rows => rows.map(r => r.dataset.row)")
        for wanted in [DONE, THREAD, FORK, BIG_THREAD, BIG_RUN]:
            assert wanted in listed, (wanted, listed)
        page.locator("#search-id").fill("branch")
        page.keyboard.press("Enter")
        expect(page.locator("tr[data-row]")).to_have_count(2)
        page.screenshot(path=os.path.join(SHOTS, "list-1280.png"))

        # A thread: its fork tree, its context fitted as the API fits it, its timeline.
        page.locator(f"tr[data-row='{FORK}'] a").click()
        expect(page.locator(f"[data-view=thread][data-thread='{FORK}']")).to_be_visible()
        forks = page.locator("li[data-fork]").evaluate_all("rows => rows.map(r => [r.dataset.fork, r.dataset.depth])")
        assert forks == [[THREAD, "0"], [FORK, "1"], [FORK2, "2"]], forks
        page.locator(f"li[data-fork='{THREAD}'] a").click()
        expect(page.locator(f"[data-view=thread][data-thread='{THREAD}']")).to_be_visible()
        expect(page.locator("li[data-kind=context_replaced]")).to_have_count(1)
        expect(page.locator("li[data-kind=forked]")).to_have_count(0)
        page.locator("li[data-kind=message_appended]").first.wait_for()
        assert page.evaluate("window.pwned === undefined")
        check_context(page, THREAD, "gpt-4o")
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=os.path.join(SHOTS, "thread-1280.png"))
        page.set_viewport_size({"width": 390, "height": 844})
        page.screenshot(path=os.path.join(SHOTS, "thread-390.png"))
        page.set_viewport_size({"width": 1280, "height": 900})
        stops = tab_stops(page)
        for wanted in ["input#context-model", "button|Fit", f"a|{FORK}", "summary|Messages as they would be sent"]:
            assert any(stop.startswith(wanted) for stop in stops), (wanted, stops)

        # Large ones open in under a second: a thread of 100,000 events (a page of its
        # timeline, its context fitted), an execution of 500 calls (a page of its calls).
        timings = {}
        for name, route, ready in [
            ("thread_100k_events", f"#/threads/{BIG_THREAD}", f"[data-view=thread][data-thread='{BIG_THREAD}']"),
            ("execution_500_calls", f"#/executions/{BIG_RUN}", f"[data-view=execution][data-execution='{BIG_RUN}']"),
        ]:
            runs = []
            for _ in range(5):
                page.evaluate("location.hash = '#/'")
                expect(page.locator("[data-view=home]")).to_be_visible()
                started = time.monotonic()
                page.evaluate(f"location.hash = {json.dumps(route)}")
                page.locator(ready).wait_for()
                runs.append(round(time.monotonic() - started, 3))
            timings[name] = runs
            print(f"opened {name} in {runs} s", file=sys.stderr)
            assert min(runs) < 1.0, (name, runs)
        summary["open_seconds"] = timings
        # The big thread's context left most of it out, exactly as the API says.
        page.evaluate(f"location.hash = {json.dumps('#/threads/' + BIG_THREAD)}")
        page.locator(f"[data-view=thread][data-thread='{BIG_THREAD}']").wait_for()
        check_context(page, BIG_THREAD, "gpt-4o")
        expect(page.locator("li.event")).to_have_count(50)
        page.locator("[data-page=last]").first.click()
        expect(page.locator("li.event").last).to_have_attribute("data-seq", str(BIG_EVENTS))

        context.close()
    assert not errors, errors
    summary["console_errors"] = errors
    print(json.dumps(summary))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as error:
        print(f"assertion failed: {error!r}", file=sys.stderr)
        raise
