-- wrk script: chat turns on threads through one of the server's doors.
--
--   CONTEXTURE_BENCH_KEY=ctx_... wrk -t8 -c8 -d20s -s chat_turns.lua \
--       http://127.0.0.1:18089 -- PREFIX [TURNS_PER_THREAD] [MODEL] [DOOR]
--
-- DOOR is `chat` (the default: `POST /v1/chat/completions` with header
-- X-Contexture-Thread: PREFIX-<client>-<generation>) or `responses` (`POST /v1/responses`,
-- each turn naming the previous response's id in `previous_response_id`, as a chained
-- Responses client does; a chain's first turn names none and starts its thread).
--
-- Run it with as many wrk threads as connections (-tN -cN): each wrk thread is one client
-- with its own thread. A client sends only its new user turn each time, as a client of a
-- thread does; the server stores it, fits the thread for the model, calls the upstream and
-- records the answer. After TURNS_PER_THREAD turns a client moves on to a new thread, so the
-- fitted history stays between 1 and 2 x TURNS_PER_THREAD messages whichever the door.
-- `done()` prints one machine-readable line:
--
--   RESULT turns errors first_error_status

local clients = {}

function setup(thread)
    table.insert(clients, thread)
    thread:set("client", #clients)
end

local prefix, turns_per_thread, model, door, headers
local generation, turns_here, thread_id, counter, previous

local SENTENCES = {
    "The deploy on Tuesday failed because the migration took a lock on the events table.",
    "We moved the nightly export to a replica and the latency alarms stopped.",
    "Could you check whether the retry budget covers the upstream's 429 answers?",
    "The projection keeps the last tool result, so the summary can cite the row counts.",
}

local function next_thread()
    generation = generation + 1
    turns_here = 0
    thread_id = string.format("%s-%d-%d", prefix, client, generation)
    previous = nil
    if door == "chat" then
        headers["X-Contexture-Thread"] = thread_id
    end
end

function init(args)
    prefix = args[1] or "chat"
    turns_per_thread = tonumber(args[2] or "50")
    model = args[3] or "gpt-4o-mini"
    door = args[4] or "chat"
    if door ~= "chat" and door ~= "responses" then
        error("DOOR must be chat or responses, not " .. door)
    end
    local key = os.getenv("CONTEXTURE_BENCH_KEY")
    if not key or key == "" then
        error("set CONTEXTURE_BENCH_KEY to an API key of `contexture keys create`")
    end
    headers = { ["Authorization"] = "Bearer " .. key, ["Content-Type"] = "application/json" }
    generation, counter = 0, 0
    turns, errors, first_error = 0, 0, 0
    next_thread()
end

function request()
    counter = counter + 1
    local text = string.format("(%s, turn %d) %s", thread_id, counter,
        SENTENCES[counter % #SENTENCES + 1])
    if door == "responses" then
        local chained = ""
        if previous then
            chained = string.format(',"previous_response_id":"%s"', previous)
        end
        local body = string.format('{"model":"%s","input":"%s"%s}', model, text, chained)
        return wrk.format("POST", "/v1/responses", headers, body)
    end
    local body = string.format(
        '{"model":"%s","messages":[{"role":"user","content":"%s"}]}', model, text)
    return wrk.format("POST", "/v1/chat/completions", headers, body)
end

function response(status, _, body)
    if status == 200 then
        turns = turns + 1
        if door == "responses" then
            previous = string.match(body, '"id":"(resp_[^"]+)"')
        end
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
    local total_turns, total_errors, status = 0, 0, 0
    for _, thread in ipairs(clients) do
        total_turns = total_turns + thread:get("turns")
        total_errors = total_errors + thread:get("errors")
        if status == 0 then status = thread:get("first_error") end
    end
    io.write(string.format("RESULT %d %d %d\n", total_turns, total_errors, status))
end
