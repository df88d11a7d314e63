-- wrk script: "append one message, then get the fitted projection" against `contexture serve`.
--
--   CONTEXTURE_BENCH_KEY=ctx_... wrk -t32 -c32 -d20s --latency -s append_and_fit.lua \
--       http://127.0.0.1:8089 -- PREFIX [PAIRS_PER_THREAD] [SEED_MESSAGES] [MODEL]
--
-- Run it with as many wrk threads as connections (-tN -cN): wrk's Lua has one state per wrk
-- thread and no notion of a connection, so one connection per thread is what lets each
-- client keep its own conversation and time its own pairs. Each client:
--
--   1. seeds a fresh conversation `PREFIX-<client>-<generation>` with SEED_MESSAGES messages
--      (one `POST /v1/threads/{id}/messages`; timed apart, not part of the figures);
--   2. then loops: `POST .../messages` with one user message, and once it has answered,
--      `GET .../context?model=MODEL`: one pair, one operation;
--   3. after PAIRS_PER_THREAD pairs moves to the next generation (back to 1), so the fitted
--      history stays between SEED+1 and SEED+PAIRS messages instead of growing with the run
--      (a client alone on a thread would otherwise fit a history of thousands of messages).
--
-- Every request is timed on CLOCK_MONOTONIC (LuaJIT ffi) from `request()` to `response()`,
-- which bracket wrk's own timing of it; a pair is timed from its append's `request()` to its
-- fit's `response()`, so it includes the client's turn-around between the two requests.
-- `done()` prints a human summary and one machine-readable `RESULT` line:
--
--   RESULT pairs pairs_per_s requests_per_s pair_p50 pair_p90 pair_p99 pair_max
--          append_p50 append_p99 fit_p50 fit_p99 errors fit_messages_min fit_messages_max
--
-- (latencies in milliseconds; `errors` counts answers other than 200 and socket errors).

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } contexture_bench_timespec;
int clock_gettime(int clock_id, contexture_bench_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local timespec = ffi.new("contexture_bench_timespec")

local function now_us()
    ffi.C.clock_gettime(CLOCK_MONOTONIC, timespec)
    return tonumber(timespec.tv_sec) * 1000000 + tonumber(timespec.tv_nsec) / 1000
end

-- Main state: number the wrk threads (= clients) and keep them for `done()`.
local clients = {}

function setup(thread)
    table.insert(clients, thread)
    thread:set("client", #clients)
end

-- Client state (globals, so that `done()` can read them with `thread:get`).
local prefix, pairs_per_thread, seed_messages, model
local post_headers, get_headers
local phase, sent_at, pair_started, generation, pairs_here, thread_id, counter

local function json_string(text)
    return '"' .. text:gsub('[%c"\\]', function(c)
        return string.format("\\u%04x", string.byte(c))
    end) .. '"'
end

local SENTENCES = {
    "The deploy on Tuesday failed because the migration took a lock on the events table.",
    "We moved the nightly export to a replica and the latency alarms stopped.",
    "Could you check whether the retry budget covers the upstream's 429 answers?",
    "The projection keeps the last tool result, so the summary can cite the row counts.",
    "Customers in the EU region see the new pricing page one day later than the rest.",
    "A fork of this conversation tried the other plan; its notes were merged back.",
}

local function prose(n, words)
    local parts = {}
    local i = n
    while #table.concat(parts, " ") < words do
        i = i + 1
        parts[#parts + 1] = SENTENCES[(i % #SENTENCES) + 1]
    end
    return table.concat(parts, " ")
end

-- `prose(n, words)` depends on `n` modulo the number of sentences only, so each client
-- escapes every variant once, in `init`, and requests only splice in their own prefix:
-- the load tool shares the server's two cores, and its CPU per request is kept small.
local escaped_prose = { [200] = {}, [400] = {} }

local function prose_json(n, words)
    return escaped_prose[words][n % #SENTENCES + 1]
end

-- The message's JSON string: a prefix of thread id and number (characters that need no
-- escaping), then the prose.
local function content_json(label, n, words)
    return string.format('"(%s, %s %d) %s"', thread_id, label, n, prose_json(n, words))
end

local function seed_body()
    local messages = {}
    for i = 1, seed_messages do
        local role = (i % 2 == 1) and "user" or "assistant"
        messages[#messages + 1] = '{"role":"' .. role .. '","content":' .. content_json("seed", i, 400) .. "}"
    end
    return '{"messages":[' .. table.concat(messages, ",") .. "]}"
end

local function next_thread()
    generation = generation + 1
    pairs_here = 0
    thread_id = string.format("%s-%d-%d", prefix, client, generation)
    phase = "seed"
end

function init(args)
    prefix = args[1] or "bench"
    pairs_per_thread = tonumber(args[2] or "100")
    seed_messages = tonumber(args[3] or "20")
    model = args[4] or "gpt-4o-mini"
    for _, words in ipairs({ 200, 400 }) do
        for n = 0, #SENTENCES - 1 do
            -- Without its quotes: `content_json` puts the prefix inside them.
            escaped_prose[words][n % #SENTENCES + 1] = json_string(prose(n, words)):sub(2, -2)
        end
    end
    local key = os.getenv("CONTEXTURE_BENCH_KEY")
    if not key or key == "" then
        error("set CONTEXTURE_BENCH_KEY to an API key of `contexture keys create`")
    end
    wrk.headers["Authorization"] = "Bearer " .. key
    post_headers = { ["Authorization"] = "Bearer " .. key, ["Content-Type"] = "application/json" }
    get_headers = { ["Authorization"] = "Bearer " .. key }
    generation, counter = 0, 0
    append_ms, fit_ms, pair_ms, seed_ms = {}, {}, {}, {}
    errors, first_error = 0, nil
    fit_messages_min, fit_messages_max = math.huge, 0
    next_thread()
end

function request()
    local path = "/v1/threads/" .. thread_id
    local text
    if phase == "seed" then
        text = wrk.format("POST", path .. "/messages", post_headers, seed_body())
    elseif phase == "append" then
        counter = counter + 1
        local body = '{"messages":[{"role":"user","content":' .. content_json("message", counter, 200) .. "}]}"
        text = wrk.format("POST", path .. "/messages", post_headers, body)
    else
        text = wrk.format("GET", path .. "/context?model=" .. model, get_headers, nil)
    end
    sent_at = now_us()
    return text
end

local function note_error(status, body)
    errors = errors + 1
    if not first_error then
        first_error = string.format("%s %s: %d %s", phase, thread_id, status, (body or ""):sub(1, 300))
    end
end

function response(status, headers, body)
    local took = (now_us() - sent_at) / 1000
    if status ~= 200 then
        note_error(status, body)
    end
    if phase == "seed" then
        seed_ms[#seed_ms + 1] = took
        phase = "append"
    elseif phase == "append" then
        append_ms[#append_ms + 1] = took
        pair_started = sent_at
        phase = "fit"
    else
        fit_ms[#fit_ms + 1] = took
        pair_ms[#pair_ms + 1] = (now_us() - pair_started) / 1000
        if status == 200 and (pairs_here == 0 or pairs_here == pairs_per_thread - 1) then
            -- The fitted history's length (one `"role":` per message), on the first and last
            -- pair of each conversation only: scanning every body costs the client CPU.
            local _, n = body:gsub('"role":', "")
            if n < fit_messages_min then fit_messages_min = n end
            if n > fit_messages_max then fit_messages_max = n end
        end
        pairs_here = pairs_here + 1
        if pairs_here >= pairs_per_thread then
            next_thread()
        else
            phase = "append"
        end
    end
end

local function percentile(sorted, p)
    if #sorted == 0 then return 0 / 0 end
    local rank = math.ceil(p / 100 * #sorted)
    if rank < 1 then rank = 1 end
    return sorted[rank]
end

local function gather(name)
    local all = {}
    for _, thread in ipairs(clients) do
        local values = thread:get(name)
        if values then
            for _, v in ipairs(values) do all[#all + 1] = v end
        end
    end
    table.sort(all)
    return all
end

function done(summary, latency, requests)
    local seconds = summary.duration / 1000000
    local pairs = gather("pair_ms")
    local appends = gather("append_ms")
    local fits = gather("fit_ms")
    local seeds = gather("seed_ms")
    local errs, min_msgs, max_msgs, first = 0, math.huge, 0, nil
    for _, thread in ipairs(clients) do
        errs = errs + (thread:get("errors") or 0)
        min_msgs = math.min(min_msgs, thread:get("fit_messages_min") or math.huge)
        max_msgs = math.max(max_msgs, thread:get("fit_messages_max") or 0)
        first = first or thread:get("first_error")
    end
    local socket = summary.errors
    errs = errs + socket.connect + socket.read + socket.write + socket.timeout
    local p = percentile
    io.write(string.format(
        "clients %d, %.1f s: %d pairs (%.1f pairs/s), %d requests (%.1f requests/s), %d seeds, %d errors\n",
        #clients, seconds, #pairs, #pairs / seconds, summary.requests, summary.requests / seconds,
        #seeds, errs))
    io.write(string.format("  pair   (append + fit) ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n",
        p(pairs, 50), p(pairs, 90), p(pairs, 99), pairs[#pairs] or 0))
    io.write(string.format("  append ms:               p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n",
        p(appends, 50), p(appends, 90), p(appends, 99), appends[#appends] or 0))
    io.write(string.format("  fit    ms:               p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n",
        p(fits, 50), p(fits, 90), p(fits, 99), fits[#fits] or 0))
    io.write(string.format("  seed   ms:               p50 %.2f  p99 %.2f   fitted messages %d..%d\n",
        p(seeds, 50), p(seeds, 99), min_msgs == math.huge and 0 or min_msgs, max_msgs))
    if first then io.write("  first error: " .. first .. "\n") end
    io.write(string.format(
        "RESULT %d %.1f %.1f %.3f %.3f %.3f %.3f %.3f %.3f %.3f %.3f %d %d %d\n",
        #pairs, #pairs / seconds, summary.requests / seconds,
        p(pairs, 50), p(pairs, 90), p(pairs, 99), pairs[#pairs] or 0,
        p(appends, 50), p(appends, 99), p(fits, 50), p(fits, 99), errs,
        min_msgs == math.huge and 0 or min_msgs, max_msgs))
end
