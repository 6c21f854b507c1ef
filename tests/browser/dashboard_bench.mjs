// A benchmark, not a test (docs/benchmarks.md, "The dashboard on a large pool"): the dashboard in headless Chromium
// against the real accelpool-manager holding a static host of --devices devices with --waiting requests queued,
// while --clients guests cycle acquire+release as fast as the manager answers. It reports
//   - how long the page takes, after sign-in, to show the whole pool;
//   - how long each view takes to draw after its tab is clicked (to the second frame after the click);
//   - how long the queue view takes to show its last page after a position is entered, and what GET /v1/queue
//     costs for a page at the queue's head and at its end, with the admin's token and with the tenant's;
//   - the page's long tasks (main thread busy > 50 ms) while it follows the live stream;
//   - the guests' cycles/s and round trips, and the manager's CPU per cycle, with no page open, then with one page
//     on the queue's last page (read again every 5 s), then with one page, then with --pages pages watching.
// Usage: node --experimental-websocket dashboard_bench.mjs --manager BIN --work DIR [--devices 10000]
//        [--waiting 100000] [--clients 4] [--seconds 10] [--pages 10] [--chromium BIN]
import fs from 'node:fs';
import path from 'node:path';

import { Cdp, closeBrowser, findChromium, launchChromium, openPage } from '../support/chromium.mjs';
import { Guest } from '../support/guest_client.mjs';
import { request, startManager, waiter } from '../support/manager_process.mjs';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => (a.startsWith('--') ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []));
const devices = Number(args.devices ?? 10000);
const waiting = Number(args.waiting ?? 100000);
const clients = Number(args.clients ?? 4);
const seconds = Number(args.seconds ?? 10);
const pages = Number(args.pages ?? 10);
const kHungAfterMs = Number(args['hung-after-s'] ?? 180) * 1000;
const kPerGuest = 1000;  // queued requests per waiting guest ([leases] max_per_guest)
let stopping = false;
const children = [];
process.on('exit', () => children.forEach((c) => c.kill('SIGKILL')));
function fail(message) {
  console.error(`dashboard-bench: FAIL: ${message}`);
  process.exit(1);
}
const say = (line) => console.log(`dashboard-bench: ${line}`);
if (!args.manager || !args.work) fail('usage: --manager BIN --work DIR [--devices N] [--waiting N] [--clients N] [--seconds S] [--pages N]');
const chromium = findChromium(args.chromium);
if (!chromium) fail('no chromium on PATH (scripts/setup.sh installs Debian\'s chromium)');
const eventually = waiter(kHungAfterMs, fail);

// --- the pool -------------------------------------------------------------------------------------------------------
fs.rmSync(args.work, { recursive: true, force: true });
fs.mkdirSync(args.work, { recursive: true });
const started = await startManager({
  bin: args.manager, work: args.work, dataDir: path.join(args.work, 'manager'), eventually, fail,
  config: '[leases]\nttl_s = 3600\n[guest]\ntcp = "127.0.0.1:0"\nunix = ""\n[admin]\nlisten = "127.0.0.1:0"\n' +
          `[[hosts]]\nname = "local"\nbackend = "static"\n[[hosts.devices]]\nkind = "fpga"\ncount = ${devices}\n` +
          '[[hosts.devices]]\nkind = "held"\ncount = 1\n[[tenants]]\nname = "t"\n',
  onExit: (code, text) => { if (!stopping) fail(`accelpool-manager exited (${code}):\n${text.slice(-4000)}`); },
});
children.push(started.process);
const admin = started.tokenOf('admin token');
const token = started.tokenOf('guest token for tenant t');
const guestPort = Number(started.endpoints.guest_tcp.split(':').pop());

const holder = await Guest.connect(guestPort, token, 'holder');
const held = await holder.call('acquire', { kind: 'held' });
if (held.result?.lease?.state !== 'granted') fail(`the held device was not granted: ${JSON.stringify(held)}`);
let t0 = performance.now();
const waiters = [];
for (let g = 0; g * kPerGuest < waiting; g++) {
  const guest = await Guest.connect(guestPort, token, `waiting-${g}`);
  const n = Math.min(kPerGuest, waiting - g * kPerGuest);
  waiters.push(Promise.all(Array.from({ length: n }, () => guest.call('acquire', { kind: 'held' }))));
}
const queued = (await Promise.all(waiters)).flat();
if (queued.some((r) => r.result?.lease?.state !== 'queued')) fail('a waiting request was not queued');
say(`${queued.length} requests queued in ${((performance.now() - t0) / 1000).toFixed(1)} s; ${devices} devices`);

// --- the guests' load and the manager's CPU ---------------------------------------------------------------------------
function managerCpuSeconds() {
  const fields = fs.readFileSync(`/proc/${started.process.pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;  // utime + stime, in clock ticks of 1/100 s
}
const cyclers = [];
for (let c = 0; c < clients; c++) {
  cyclers.push(await Guest.connect(guestPort, token, `cycle-${c}`));
}
async function cycleFor(what) {
  const trips = [];
  const cpu0 = managerCpuSeconds();
  const end = performance.now() + seconds * 1000;
  await Promise.all(cyclers.map(async (g) => {
    while (performance.now() < end) {
      const start = performance.now();
      const a = await g.call('acquire', { kind: 'fpga' });
      if (a.result?.lease?.state !== 'granted') fail(`acquire: ${JSON.stringify(a)}`);
      const r = await g.call('release', { lease: a.result.lease.id });
      if (!r.result) fail(`release: ${JSON.stringify(r)}`);
      trips.push(performance.now() - start);
    }
  }));
  const cpu = managerCpuSeconds() - cpu0;
  trips.sort((a, b) => a - b);
  const at = (q) => trips[Math.min(trips.length - 1, Math.floor(q * trips.length))].toFixed(1);
  say(`${what}: ${(trips.length / seconds).toFixed(0)} acquire+release cycles/s (${clients} guests), cycle p50 ${at(0.5)} ms, ` +
      `p99 ${at(0.99)} ms, max ${trips[trips.length - 1].toFixed(1)} ms; manager CPU ${(cpu * 1e6 / trips.length).toFixed(0)} us per cycle`);
}
await cycleFor('no page open');

// --- the pages ------------------------------------------------------------------------------------------------------
const { process: browser, devtools } = await launchChromium({
  bin: chromium, profileDir: path.join(args.work, 'profile'), hungAfterMs: kHungAfterMs, fail, exitExpected: () => stopping,
});
children.push(browser);
const cdp = new Cdp(devtools, fail, kHungAfterMs);
await cdp.open();
const kLongTasks = `window.__longTasks = []; new PerformanceObserver((list) => { for (const e of list.getEntries()) ` +
                   `window.__longTasks.push([e.startTime, e.duration]); }).observe({ type: 'longtask', buffered: true });`;
// Opens a page, signs in as the admin and waits until it shows every device; returns the page and the time that took.
async function signedInPage() {
  const p = await openPage(cdp, fail, { ownContext: true });
  await p.page('Page.addScriptToEvaluateOnNewDocument', { source: kLongTasks });
  await p.page('Performance.enable');
  await p.page('Emulation.setDeviceMetricsOverride', { width: 1280, height: 900, deviceScaleFactor: 1, mobile: false });
  await p.page('Page.navigate', { url: `${started.endpoints.admin}/` });
  // Loaded: the page's script has wired the form (on DOMContentLoaded), so the submit reaches it.
  await eventually('the sign-in page loads', () => p.evaluate(`document.readyState === 'complete'`));
  const start = performance.now();
  await p.evaluate(`(() => { const e = document.querySelector('#token'); e.value = ${JSON.stringify(admin)};
    document.querySelector('#sign-in-form').requestSubmit(); return true; })()`);
  const shows = `(() => { const busy = document.querySelector('[data-card=busy] .n'), queue = document.querySelector('[data-card=queue] .n');
    return [busy?.textContent, queue?.textContent, document.querySelector('#sign-in-error')?.textContent]; })()`;
  await waiter(kHungAfterMs, async (what) => fail(`${what} (it shows ${JSON.stringify(await p.evaluate(shows))})`))(
    'the page shows the whole pool', async () => {
      const [busy, queue] = await p.evaluate(shows);
      return busy?.endsWith(`/ ${devices + 1}`) && queue === String(queued.length);
    });
  return { ...p, shownMs: performance.now() - start };
}
const first = await signedInPage();
say(`sign-in to the whole pool shown (${devices + 1} devices, ${queued.length} waiting): ${first.shownMs.toFixed(0)} ms`);
const viewMs = [];
for (const view of ['overview', 'queue', 'leases', 'devices', 'overview', 'devices']) {  // ends on the busiest live view
  viewMs.push([view, await first.evaluate(`new Promise((resolve) => { const start = performance.now();
    document.querySelector('#tab-${view}').click();
    requestAnimationFrame(() => requestAnimationFrame(() => resolve(performance.now() - start))); })`)]);
}
const shownRows = await first.evaluate(`document.querySelectorAll('#devices-table tr[data-device]').length`);
say(`views drawn after a click (to the second frame): ${viewMs.map(([v, ms]) => `${v} ${ms.toFixed(0)} ms`).join(', ')} ` +
    `(the devices table draws ${shownRows} rows a page)`);

// The queue's last page: entered as a position on the page, and GET /v1/queue's own time for it and for the head.
const kQueuePage = 100;
const lastPage = Math.max(1, queued.length - kQueuePage + 1);
const pagedMs = await first.evaluate(`new Promise((resolve) => {
  document.querySelector('#tab-queue').click();
  const start = performance.now();
  document.querySelector('#queue-at').value = '${lastPage}';
  document.querySelector('#queue-jump').requestSubmit();
  const shown = () => (document.querySelector('#queue-table tr[data-position="${lastPage}"]') ? resolve(performance.now() - start)
                                                                                              : requestAnimationFrame(shown));
  shown(); })`);
async function queueReadMs(who, cursor) {
  const times = [];
  for (let i = 0; i < 5; i++) {
    const start = performance.now();
    const r = await request(started.adminPort, 'GET', `/v1/queue?limit=${kQueuePage}&cursor=${cursor}`, { token: who });
    if (r.status !== 200 || r.json.queue.length === 0) fail(`GET /v1/queue?cursor=${cursor}: ${r.status} ${r.body.slice(0, 300)}`);
    times.push(performance.now() - start);
  }
  return times.sort((a, b) => a - b)[2].toFixed(1);
}
say(`the queue's last page (position ${lastPage} entered) shown in ${pagedMs.toFixed(0)} ms; GET /v1/queue?limit=${kQueuePage} ` +
    `(p50 of 5), first / last page: admin ${await queueReadMs(admin, 0)} / ${await queueReadMs(admin, lastPage - 1)} ms, ` +
    `tenant t (its own ${queued.length}) ${await queueReadMs(token, 0)} / ${await queueReadMs(token, lastPage - 1)} ms`);
await cycleFor('one page on the queue\'s last page');
await first.evaluate(`document.querySelector('#tab-devices').click() ?? true`);  // back to the busiest live view

// The page's main thread while `work` runs: its long tasks, and where its time went (Chromium's own counters).
async function longTasksDuring(p, what, work) {
  const metrics = async () => Object.fromEntries((await p.page('Performance.getMetrics')).metrics.map((m) => [m.name, m.value]));
  const since = await p.evaluate('performance.now()');
  const before = await metrics();
  await work();
  const after = await metrics();
  const tasks = await p.evaluate(`window.__longTasks.filter(([start]) => start >= ${since}).map(([, d]) => d)`);
  const blocked = tasks.reduce((sum, d) => sum + Math.max(0, d - 50), 0);
  const spent = (name) => `${((after[name] - before[name]) * 1000).toFixed(0)} ms`;
  say(`${what}: the watching page had ${tasks.length} long tasks, longest ${tasks.length ? Math.max(...tasks).toFixed(0) : 0} ms, ` +
      `${blocked.toFixed(0)} ms blocked in ${seconds} s; its main thread ran ${spent('TaskDuration')} (script ` +
      `${spent('ScriptDuration')}, style ${spent('RecalcStyleDuration')}, layout ${spent('LayoutDuration')})`);
}
await longTasksDuring(first, 'one page open', () => cycleFor('one page open'));
const more = [];
for (let i = 1; i < pages; i++) more.push(await signedInPage());
if (more.length) say(`${pages} pages signed in (the other ${more.length} each showed the whole pool in ${more.map((p) => p.shownMs.toFixed(0)).join(', ')} ms)`);
await longTasksDuring(first, `${pages} pages open`, () => cycleFor(`${pages} pages open`));

stopping = true;
await closeBrowser(cdp, browser);
started.process.kill('SIGTERM');
process.exit(0);
