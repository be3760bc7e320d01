-- wrk script of bench/http: POST /v1/charges cycling through KEYS keys "<prefix>-<i>",
-- i = 0 … KEYS-1, that the bench executed once before the run (with this same body), so every
-- request is a retry of a completed call.
--   wrk ... -s replay.lua URL -- PREFIX KEYS THREADS
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

local i
local prefix, keys, nthreads
local headers = { ["Content-Type"] = "application/json" }
local body = '{"amount":1999,"currency":"usd","customer":"cus_bench"}'

function init(args)
  prefix, keys, nthreads = args[1], tonumber(args[2]), tonumber(args[3])
  i = tid
end

function request()
  headers["Idempotency-Key"] = prefix .. "-" .. (i % keys)
  i = i + nthreads
  return wrk.format("POST", "/v1/charges", headers, body)
end

-- The end of the run as one line the bench parses (latencies in µs).
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d " ..
    "p50_us=%d p90_us=%d p99_us=%d max_us=%d mean_us=%.1f\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean))
end
