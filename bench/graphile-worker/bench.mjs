// Usage: node bench.mjs POSTGRES_URL [JOBS] [CONCURRENCY] [LATENCY_SAMPLES]
// Mirrors `gatehouse bench jobs`: enqueue N no-op jobs (500 per batch), run them with one
// worker of the given concurrency, then measure enqueue-to-start latency on an idle queue.
import { run, makeWorkerUtils } from "graphile-worker";

const [connectionString, jobsArg = "10000", concArg = "64", samplesArg = "300"] = process.argv.slice(2);
const N = Number(jobsArg), concurrency = Number(concArg), samples = Number(samplesArg);
const utils = await makeWorkerUtils({ connectionString });
await utils.migrate();

let t = performance.now();
for (let i = 0; i < N; i += 500) {
  const batch = [];
  for (let j = i; j < Math.min(N, i + 500); j++) batch.push({ identifier: "noop", payload: {} });
  await utils.addJobs(batch);
}
const enqueueSecs = (performance.now() - t) / 1000;

const started = new Map();
let done = 0;
let resolveAll;
const allDone = new Promise((r) => (resolveAll = r));
t = performance.now();
const runner = await run({
  connectionString,
  concurrency,
  pollInterval: 200,
  noHandleSignals: true,
  taskList: {
    noop: async (payload) => {
      if (payload && payload.sample !== undefined) started.set(payload.sample, performance.now());
    },
  },
});
runner.events.on("job:success", () => {
  done += 1;
  if (done === N) resolveAll();
});
await allDone;
const completeSecs = (performance.now() - t) / 1000;

const lat = [];
for (let i = 0; i < samples; i++) {
  const t0 = performance.now();
  await utils.addJob("noop", { sample: i });
  while (!started.has(i) && performance.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 0.2));
  if (started.has(i)) lat.push(started.get(i) - t0);
  await new Promise((r) => setTimeout(r, 2));
}
lat.sort((a, b) => a - b);
const pct = (p) => lat[Math.min(lat.length - 1, Math.round((lat.length - 1) * p))].toFixed(2);
await runner.stop();
await utils.release();
console.log(`backend            postgres (graphile-worker)`);
console.log(`jobs               ${N} (concurrency ${concurrency})`);
console.log(`enqueue/s          ${(N / enqueueSecs).toFixed(0)} (500 per addJobs batch)`);
console.log(`completed/s        ${(N / completeSecs).toFixed(0)} (queue full at start)`);
console.log(`enqueue-to-start   p50 ${pct(0.5)} ms  p95 ${pct(0.95)} ms  p99 ${pct(0.99)} ms  (${lat.length} samples, idle queue)`);
