-- wrk script of bench/http: POST /v1/charges with a new Idempotency-Key on every request,
-- "<nonce>-<thread>-<counter>", so every request is a first execution.
--   wrk ... -s fresh.lua URL -- NONCE
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

local counter = 0
local nonce
local headers = { ["Content-Type"] = "application/json" }
local body = '{"amount":1999,"currency":"usd","customer":"cus_bench"}'

function init(args)
  nonce = args[1] or tostring(os.time())
end

function request()
  counter = counter + 1
  headers["Idempotency-Key"] = nonce .. "-" .. tid .. "-" .. counter
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
