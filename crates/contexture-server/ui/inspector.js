// The inspector page: signs in with an API key (kept in this tab's session storage only,
// sent as the bearer token, never put in a URL), shows the views the server renders for
// the address after `#`, follows a running execution through its server-sent events, and
// cancels one after a confirmation. Views arrive as HTML the server escaped; this script
// writes text with textContent only.
"use strict";

(function () {
  const KEY = "contexture.apiKey";
  const $ = (id) => document.getElementById(id);
  const content = $("content");
  /** The view shown: its route and what follows it live. */
  let current = { route: null, follow: null, refreshTimer: null };

  function apiKey() {
    return sessionStorage.getItem(KEY);
  }

  function authorized(init) {
    const headers = new Headers((init && init.headers) || {});
    headers.set("Authorization", "Bearer " + apiKey());
    return Object.assign({}, init || {}, { headers: headers });
  }

  /** The route of the address: `{kind, id, params}`; kind `home` without an id. */
  function parseRoute() {
    const hash = location.hash.replace(/^#\/?/, "");
    const [path, search] = hash.split("?", 2);
    const parts = path.split("/").filter((part) => part.length > 0);
    const params = new URLSearchParams(search || "");
    if (parts.length >= 2 && (parts[0] === "executions" || parts[0] === "threads")) {
      return { kind: parts[0], id: decodeURIComponent(parts.slice(1).join("/")), params: params };
    }
    return { kind: "home", id: null, params: params };
  }

  function showSignIn(message) {
    stopFollowing();
    $("sign-in").hidden = false;
    $("open-form").hidden = true;
    $("sign-out").hidden = true;
    $("live").hidden = true;
    content.replaceChildren();
    $("sign-in-error").textContent = message || "";
    $("api-key").focus();
  }

  function showSignedIn() {
    $("sign-in").hidden = true;
    $("open-form").hidden = false;
    $("sign-out").hidden = false;
  }

  function showMessage(title, text) {
    const section = document.createElement("section");
    section.className = "message-view";
    const heading = document.createElement("h1");
    heading.textContent = title;
    const body = document.createElement("p");
    body.textContent = text;
    section.append(heading, body);
    content.replaceChildren(section);
  }

  /** The error an API answer holds, as text. */
  async function errorText(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) {
        return body.error.message;
      }
    } catch (ignored) {
      // Not JSON: the status says it.
    }
    return response.status + " " + response.statusText;
  }

  /** The view's address on the server for `route`. */
  function viewUrl(route) {
    const query = route.params.toString();
    const path = route.kind === "home" ? "home" : route.kind + "/" + encodeURIComponent(route.id);
    return "/ui/views/" + path + (query ? "?" + query : "");
  }

  /** Shows `route`; `quiet` keeps the focus and what is open (a live refresh). */
  async function show(route, quiet) {
    if (!apiKey()) {
      showSignIn();
      return;
    }
    showSignedIn();
    // Where the focus was when the view was asked for: a user who has since gone on to
    // type elsewhere (the open form, while the list loads) keeps the focus.
    const focusedBefore = document.activeElement;
    let response;
    try {
      response = await fetch(viewUrl(route), authorized());
    } catch (error) {
      showMessage("The server cannot be reached", String(error));
      return;
    }
    if (response.status === 401) {
      sessionStorage.removeItem(KEY);
      showSignIn(await errorText(response));
      return;
    }
    if (!response.ok) {
      stopFollowing();
      showMessage(response.status === 404 ? "Not found" : "The view failed", await errorText(response));
      return;
    }
    const html = await response.text();
    if (current.route !== null && JSON.stringify(current.route) !== JSON.stringify(routeKey(route))) {
      return; // Another view was asked for meanwhile.
    }
    const opened = quiet ? openDetails() : [];
    content.innerHTML = html;
    reopen(opened);
    const typing =
      document.activeElement !== focusedBefore && Boolean(document.activeElement?.closest("form"));
    if (!quiet && !typing) {
      window.scrollTo(0, 0);
      content.focus({ preventScroll: true });
    }
    afterShow(route);
  }

  function routeKey(route) {
    return [route.kind, route.id, route.params.toString()];
  }

  /** The `details` open in the view, by their place, to keep them open across a refresh. */
  function openDetails() {
    return Array.from(content.querySelectorAll("details[open]")).map(detailsPlace);
  }

  function detailsPlace(details) {
    const call = details.closest("[data-call]");
    return (call ? call.dataset.call : "") + "/" + details.className;
  }

  function reopen(places) {
    if (places.length === 0) {
      return;
    }
    const wanted = new Set(places);
    for (const details of content.querySelectorAll("details")) {
      if (wanted.has(detailsPlace(details))) {
        details.open = true;
      }
    }
  }

  /** What a view needs once shown: an execution that runs is followed live. */
  function afterShow(route) {
    const execution = content.querySelector("[data-view=execution]");
    const running = execution && execution.dataset.status === "running";
    $("live").hidden = !running;
    if (!running) {
      stopFollowing();
      return;
    }
    $("cancel-confirm").hidden = true;
    $("cancel-run").hidden = false;
    $("cancel-run").disabled = execution.dataset.cancelRequested === "true";
    if (current.follow === null || current.follow.id !== route.id) {
      follow(route.id);
    }
  }

  function stopFollowing() {
    if (current.follow !== null) {
      current.follow.abort.abort();
      current.follow = null;
    }
    clearTimeout(current.refreshTimer);
    $("live").hidden = true;
  }

  /** Follows execution `id` through its server-sent events, refreshing the view as they come. */
  async function follow(id) {
    stopFollowing();
    const state = { id: id, abort: new AbortController(), after: 0, ended: false };
    current.follow = state;
    $("live").hidden = false;
    $("live-state").textContent = "Running: following it live";
    while (current.follow === state && !state.ended) {
      try {
        const response = await fetch(
          "/v1/executions/" + encodeURIComponent(id) + "/events?after=" + state.after,
          authorized({ signal: state.abort.signal, headers: { Accept: "text/event-stream" } })
        );
        if (!response.ok) {
          $("live-state").textContent = "Stopped following: " + (await errorText(response));
          return;
        }
        await readEvents(response.body, state);
      } catch (error) {
        if (state.abort.signal.aborted) {
          return;
        }
        $("live-state").textContent = "Reconnecting…";
        await new Promise((resolve) => setTimeout(resolve, 1000));
      }
    }
    if (current.follow === state) {
      current.follow = null;
      refresh(0);
    }
  }

  /** Reads a stream of server-sent events, noting each event's seq and the run's end. */
  async function readEvents(body, state) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        return;
      }
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let type = "message";
        for (const line of block.split("\n")) {
          if (line.startsWith("id:")) {
            state.after = Number(line.slice(3).trim()) || state.after;
          } else if (line.startsWith("event:")) {
            type = line.slice(6).trim();
          }
        }
        if (type === "run_ended") {
          state.ended = true;
        }
        refresh(state.ended ? 0 : 300);
      }
    }
  }

  /** Shows the current view again after `delay` ms, once for a burst of events. */
  function refresh(delay) {
    clearTimeout(current.refreshTimer);
    current.refreshTimer = setTimeout(() => {
      const route = parseRoute();
      if (route.kind === "executions") {
        show(route, true);
      }
    }, delay);
  }

  async function cancelRun() {
    const route = parseRoute();
    $("cancel-confirm").hidden = true;
    $("cancel-run").disabled = true;
    $("live-state").textContent = "Cancelling…";
    const response = await fetch(
      "/v1/executions/" + encodeURIComponent(route.id) + "/cancel",
      authorized({
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ reason: "cancelled from the inspector" }),
      })
    );
    $("live-state").textContent = response.ok
      ? "Cancel requested: the run stops at its next step"
      : "Cancel failed: " + (await errorText(response));
    refresh(0);
  }

  function route() {
    const shown = parseRoute();
    current.route = routeKey(shown);
    if (shown.id !== null) {
      $("open-kind").value = shown.kind;
      $("open-id").value = shown.id;
    } else {
      $("open-id").value = "";
    }
    show(shown, false);
  }

  $("sign-in").addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) {
      return;
    }
    // The key is checked before it is kept.
    const response = await fetch("/v1/threads?limit=1", {
      headers: { Authorization: "Bearer " + key },
    });
    if (!response.ok) {
      $("sign-in-error").textContent = "This key was refused: " + (await errorText(response));
      return;
    }
    sessionStorage.setItem(KEY, key);
    $("api-key").value = "";
    route();
  });
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    showSignIn("Signed out.");
  });
  $("open-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = $("open-id").value.trim();
    if (id) {
      location.hash = "#/" + $("open-kind").value + "/" + encodeURIComponent(id);
    }
  });
  // The list's search: its text in the address, from the newest.
  content.addEventListener("submit", (event) => {
    const form = event.target.closest("[data-search-form]");
    if (!form) {
      return;
    }
    event.preventDefault();
    const text = form.querySelector("input[name=q]").value.trim();
    location.hash = text ? "#/?q=" + encodeURIComponent(text) : "#/";
  });
  // A thread's view: fitting its context for another model keeps its timeline's page.
  content.addEventListener("submit", (event) => {
    const form = event.target.closest("[data-model-form]");
    if (!form) {
      return;
    }
    event.preventDefault();
    const shown = parseRoute();
    const model = form.querySelector("input[name=model]").value.trim();
    if (model) {
      shown.params.set("model", model);
    }
    location.hash = "#/" + shown.kind + "/" + encodeURIComponent(shown.id) + "?" + shown.params.toString();
  });
  $("cancel-run").addEventListener("click", () => {
    $("cancel-confirm").hidden = false;
    $("cancel-run").hidden = true;
    $("cancel-no").focus();
  });
  $("cancel-no").addEventListener("click", () => {
    $("cancel-confirm").hidden = true;
    $("cancel-run").hidden = false;
    $("cancel-run").focus();
  });
  $("cancel-yes").addEventListener("click", () => {
    $("cancel-run").hidden = false;
    cancelRun();
  });
  window.addEventListener("hashchange", route);
  route();
})();
