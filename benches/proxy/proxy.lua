-- wrk script: one request shape through a proxy's door, against a static upstream.
--
--   PROXY_BENCH_KEY=... wrk -t32 -c32 -d10s -s proxy.lua http://127.0.0.1:18191 -- \
--       DOOR STREAM [THREAD_PREFIX] [TURNS_PER_THREAD] [MODEL]
--
-- DOOR is `chat` (`POST /v1/chat/completions`), `responses` (`POST /v1/responses`) or
-- `messages` (`POST /v1/messages`, Anthropic's shape). STREAM is 1 to ask for a streamed
-- answer, 0 for a whole one. THREAD_PREFIX, when given, names a Contexture thread per client
-- (header X-Contexture-Thread: PREFIX-<client>-<generation>); the client sends only its new
-- user turn and moves on to a new thread after TURNS_PER_THREAD turns, so the fitted history
-- stays between 1 and 2 x TURNS_PER_THREAD messages. Without it every request is one user
-- turn on its own, as through a transparent proxy.
--
-- Run it with as many wrk threads as connections (-tN -cN). `done()` prints one
-- machine-readable line:
--
--   RESULT requests errors first_error_status

local clients = {}

function setup(thread)
    table.insert(clients, thread)
    thread:set("client", #clients)
end

local door, stream, prefix, turns_per_thread, model, headers, path
local generation, turns_here, counter

local SENTENCES = {
    "The deploy on Tuesday failed because the migration took a lock on the events table.",
    "We moved the nightly export to a replica and the latency alarms stopped.",
    "Could you check whether the retry budget covers the upstream's 429 answers?",
    "The projection keeps the last tool result, so the summary can cite the row counts.",
}

local function next_thread()
    generation = generation + 1
    turns_here = 0
    if prefix ~= "" then
        headers["X-Contexture-Thread"] = string.format("%s-%d-%d", prefix, client, generation)
    end
end

function init(args)
    door = args[1] or "chat"
    stream = (args[2] or "0") == "1"
    prefix = args[3] or ""
    turns_per_thread = tonumber(args[4] or "50")
    model = args[5] or "gpt-4o-mini"
    local key = os.getenv("PROXY_BENCH_KEY")
    if not key or key == "" then
        error("set PROXY_BENCH_KEY to the proxy's API key")
    end
    headers = { ["Authorization"] = "Bearer " .. key, ["Content-Type"] = "application/json" }
    if door == "chat" then
        path = "/v1/chat/completions"
    elseif door == "responses" then
        path = "/v1/responses"
    elseif door == "messages" then
        path = "/v1/messages"
        headers["anthropic-version"] = "2023-06-01"
        headers["x-api-key"] = key
    else
        error("DOOR must be chat, responses or messages, not " .. door)
    end
    generation, counter = 0, 0
    requests, errors, first_error = 0, 0, 0
    next_thread()
end

function request()
    counter = counter + 1
    local text = string.format("(client %d, request %d) %s", client, counter,
        SENTENCES[counter % #SENTENCES + 1])
    local streamed = stream and ',"stream":true' or ""
    local body
    if door == "responses" then
        body = string.format('{"model":"%s","input":"%s"%s}', model, text, streamed)
    elseif door == "messages" then
        body = string.format(
            '{"model":"%s","max_tokens":256,"messages":[{"role":"user","content":"%s"}]%s}',
            model, text, streamed)
    else
        body = string.format('{"model":"%s","messages":[{"role":"user","content":"%s"}]%s}',
            model, text, streamed)
    end
    return wrk.format("POST", path, headers, body)
end

function response(status, _, _)
    if status == 200 then
        requests = requests + 1
    else
        errors = errors + 1
        if first_error == 0 then first_error = status end
    end
    turns_here = turns_here + 1
    if turns_here >= turns_per_thread then
        next_thread()
    end
end

function done(_, _, _)
    local total, total_errors, status = 0, 0, 0
    for _, thread in ipairs(clients) do
        total = total + thread:get("requests")
        total_errors = total_errors + thread:get("errors")
        if status == 0 then status = thread:get("first_error") end
    end
    io.write(string.format("RESULT %d %d %d\n", total, total_errors, status))
end
